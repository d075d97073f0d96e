"""Data pipeline: raw parallel text -> SentencePiece -> cached token ids -> token-budget batches."""

from transformer.data.collate import Batch, Collator
from transformer.data.datamodule import TranslationDataModule
from transformer.data.sampler import TokenBudgetBatchSampler
from transformer.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer, train_tokenizer
from transformer.errors import DataError

__all__ = [
    "BOS_ID",
    "EOS_ID",
    "PAD_ID",
    "UNK_ID",
    "Batch",
    "Collator",
    "DataError",
    "TokenBudgetBatchSampler",
    "Tokenizer",
    "TranslationDataModule",
    "train_tokenizer",
]
