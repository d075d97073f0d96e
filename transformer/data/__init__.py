"""Data pipeline: raw parallel text -> SentencePiece -> cached token ids -> token-budget batches.

:class:`TranslationDataModule` (Lightning) is imported on first use, so that what needs only the
tokenizer or the collator (translation, export) does not load Lightning.
"""

from typing import Any

from transformer.data.collate import Batch, Collator
from transformer.data.sampler import TokenBudgetBatchSampler
from transformer.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer
from transformer.data.tokenizer_training import train_tokenizer
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


def __getattr__(name: str) -> Any:  # PEP 562
    if name == "TranslationDataModule":
        from transformer.data.datamodule import TranslationDataModule

        return TranslationDataModule
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
