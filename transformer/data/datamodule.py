"""The LightningDataModule: raw parallel text -> SentencePiece -> cached token ids -> batches
(:mod:`transformer.data.batches`)."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightning as L

from transformer.data.batches import Batches
from transformer.data.corpora import SOURCE_OPTIONS, Corpus, CorpusTexts, make_corpora
from transformer.data.prepare import check_batching, prepare, tokenizer_files
from transformer.data.sampler import TokenBudgetBatchSampler
from transformer.data.subword_sampling import sampling_options
from transformer.data.token_cache import ConcatSplit, TokenizedSplit
from transformer.data.tokenizer import PAD_ID, Tokenizer
from transformer.data.tokenizer_training import SPM_TRAIN_SENTENCES
from transformer.errors import ConfigError, UserError

log = logging.getLogger(__name__)


class TranslationDataModule(Batches, L.LightningDataModule):
    """Batches of one translation direction of a parallel corpus, or of several corpora and
    directions (``corpora``, ``target_token``: :mod:`transformer.data.corpora`).

    ``prepare_data`` (once per node) downloads what is missing, reads and checks the raw text,
    trains the SentencePiece model(s) on the training splits and tokenizes every split into
    ``cache_dir`` (:func:`transformer.data.prepare.prepare`); a later run with the same data and
    settings finds all of it there. ``setup`` loads the tokenizers and token ids (building them
    first if ``prepare_data`` was not called). Tokenizers given by :meth:`use_tokenizers` (a
    checkpoint's, when resuming) replace the trained ones.

    Training pairs with an empty side or more than ``max_len`` pieces on a side are dropped (and
    counted in the log); validation and test splits are kept whole, in corpus order, so that
    ``Batch.ids`` index ``references(split)``. Under DDP the trainer needs
    ``use_distributed_sampler=False``: the batch sampler shards by itself. With several corpora,
    training samples them by their weights, and validation and test run per direction
    (:attr:`directions`; the stage aliases ``val``/``test`` then take a ``direction``, the first
    by default).

    ``spm_sampling`` (``alpha``, ``nbest``; alpha null: off) segments the training pairs anew each
    epoch, in the loader workers (:mod:`transformer.data.subword_sampling`); validation and test
    keep the cached deterministic segmentation.

    ``source_options``: the options that only some sources read (``root``, ``download``,
    ``hf_name``, ...), as :data:`transformer.data.corpora.SOURCES` declares them; the data module
    passes them on to its corpora. ``validation_max_tokens``: training's
    ``validation.max_tokens``, the validation and test batches' token budget (None:
    ``max_tokens``).
    """

    # The options its **source_options takes: (type, default), as a parameter's annotation
    # and default say them (transformer.option_types reads both)
    keyword_options = SOURCE_OPTIONS

    def __init__(
        self,
        source: str = "multi30k",
        src_lang: str = "en",
        tgt_lang: str = "de",
        vocab_size: int = 8000,
        spm_model_type: str = "unigram",
        joint_vocab: bool = True,
        spm_train_sentences: int = SPM_TRAIN_SENTENCES,
        max_tokens: int | None = 4096,
        validation_max_tokens: int | None = None,
        batch_size: int | None = 64,
        max_len: int = 128,
        pad_to_multiple: int = 1,
        num_buckets: int = 0,
        num_workers: int = 2,
        seed: int = 1234,
        cache_dir: str = "data/cache",
        train_split: str | None = None,
        val_split: str | None = None,
        test_split: str | None = None,
        prepare_per_node: bool = True,
        corpora: list[dict[str, Any]] | None = None,
        target_token: bool | str = False,
        spm_sampling: dict[str, Any] | None = None,
        **source_options: Any,
    ) -> None:
        super().__init__()
        if unknown := sorted(set(source_options) - set(self.keyword_options)):
            raise ValueError(
                f"unknown data option(s) {unknown}: the data options are the keys of "
                f"transformer/configs/data/_shared.yaml and a source's own, "
                f"{tuple(self.keyword_options)}"
            )
        source_options = {k: d for k, (_, d) in self.keyword_options.items()} | source_options
        check_batching(max_len, max_tokens, batch_size, num_buckets, validation_max_tokens)
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(
                f"data.num_workers={num_workers!r}: give the number of loader processes, 0 or "
                "more (0: batches are made in the training process)"
            )
        if corpora is not None:  # plain lists and dicts: checkpoints load no Hydra containers
            corpora = [dict(e) if isinstance(e, Mapping) else e for e in corpora]
        if spm_sampling is not None:
            spm_sampling = dict(spm_sampling)
        self.sampling = sampling_options(spm_sampling, spm_model_type)  # None: off
        self.save_hyperparameters()  # stored in checkpoints: evaluation reads the same corpus
        # Lightning's switch: True builds the caches on every node (local disks), False on the
        # first node only (a cache_dir on a file system all nodes share).
        self.prepare_data_per_node = prepare_per_node
        self.source_name, self.root = source, source_options["root"]
        self.src_lang, self.tgt_lang = src_lang, tgt_lang
        self.vocab_size, self.joint_vocab = vocab_size, joint_vocab
        self.max_tokens, self.batch_size, self.max_len = max_tokens, batch_size, max_len
        # Validation and test batches: larger ones keep a GPU busy while validation decodes.
        self.validation_max_tokens = validation_max_tokens or max_tokens
        self.pad_to_multiple, self.num_workers, self.seed = pad_to_multiple, num_workers, seed
        self.num_buckets, self.cache_dir = num_buckets, Path(cache_dir)
        # Built now (reading nothing), so that their checks of the options run before data work.
        self.corpora: list[Corpus] = make_corpora(corpora, self.hparams)
        self.texts = CorpusTexts(self.corpora)
        self.directions = self.texts.directions
        self.tokenizer_files = tokenizer_files(
            self.cache_dir / "spm", self.corpora, vocab_size, spm_model_type, joint_vocab,
            spm_train_sentences,
        )  # fmt: skip
        self._splits: dict[tuple[int, str], TokenizedSplit] = {}  # (corpus, split) ->
        self._train: TokenizedSplit | ConcatSplit | None = None  # all training pairs
        self._train_parts: list[TokenizedSplit] = []  # each corpus's
        self._train_keys: list[tuple[int, str]] = []  # their (corpus, split)
        self.src_tokenizer: Tokenizer | None = None
        self.tgt_tokenizer: Tokenizer | None = None
        self._checkpoint_tokenizers: tuple[Tokenizer, Tokenizer] | None = None
        self._train_sampler: TokenBudgetBatchSampler | None = None
        self._sampler_state: dict[str, int] | None = None

    @property
    def src_vocab_size(self) -> int:  # (the sizes the model needs before setup)
        return self.vocab_size

    @property
    def tgt_vocab_size(self) -> int:
        return self.vocab_size

    @property
    def pad_id(self) -> int:
        return PAD_ID

    # -- the corpora's texts (:class:`CorpusTexts`) and building ------------------------------

    def split_name(self, name: str, direction: str | None = None) -> str:
        return self.texts.split_name(name, direction)

    def source_prefix(self, direction: str | None = None) -> tuple[str, ...]:
        return self.texts.source_prefix(direction)

    def references(self, split: str, direction: str | None = None) -> list[str]:
        return self.texts.references(split, direction)

    def sources(self, split: str, direction: str | None = None) -> list[str]:
        return self.texts.sources(split, direction)

    def use_tokenizers(self, src: bytes, tgt: bytes, checkpoint: str | os.PathLike) -> None:
        """Use the SentencePiece models ``checkpoint`` was trained with (``src``, ``tgt``: their
        bytes, equal for a joint vocabulary) instead of training them; call before
        ``prepare_data``/``setup``. A model trained again (on another machine, or on files
        changed or copied since) can map the model's ids to other pieces: a resumed run must use
        the checkpoint's. Their sizes must be ``vocab_size``."""
        if self._splits:
            raise RuntimeError("use_tokenizers() must come before prepare_data() and setup()")
        self._checkpoint_tokenizers = self.tokenizer_files.from_checkpoint(src, tgt, checkpoint)
        log.info("using the tokenizers of checkpoint %s, not training SentencePiece", checkpoint)

    def _build(self) -> None:
        """Tokenizers and token ids, built where missing, loaded (:func:`prepare`)."""
        done = prepare(
            self.texts, self.tokenizer_files, self.cache_dir, self.max_len,
            self._checkpoint_tokenizers,
        )  # fmt: skip
        self.src_tokenizer, self.tgt_tokenizer = done.src_tokenizer, done.tgt_tokenizer
        self._splits, self._train_keys = done.splits, done.trains
        parts = self._train_parts = [done.splits[key] for key in done.trains]
        self._train = parts[0] if len(parts) == 1 else ConcatSplit(parts)
        if self.sampling is not None:  # the tokenizers may be a checkpoint's, of another kind
            for tok in (self.src_tokenizer, self.tgt_tokenizer):
                try:
                    sampling_options(self.hparams.spm_sampling, tok.model_type)
                except ValueError as err:
                    raise ConfigError(f"tokenizer {tok.model_path.name}: {err}") from err

    def prepare_data(self) -> None:
        self._build()

    def setup(self, stage: str | None = None) -> None:
        if not self._splits:
            self._build()

    # -- the tokenized splits (their batches: :class:`Batches`) -------------------------------

    def split(self, name: str, direction: str | None = None) -> TokenizedSplit | ConcatSplit:
        """The tokenized split for a stage alias (``train``/``val``/``test``) or a split name;
        ``train`` holds every corpus's training pairs, the others are ``direction``'s."""
        if name == "train":
            return self._train
        return self._splits[self.texts.corpus(direction), self.split_name(name, direction)]

    def check_fits(self, name: str, max_positions: int) -> None:
        """Refuse a split (kept whole, unlike training's) that has a pair the model cannot take
        or that does not fit a batch of ``max_tokens``, in any direction:
        :meth:`TokenizedSplit.check_fits`."""
        for direction in self.directions:
            tag = self.texts.tag(self.texts.corpus(direction))
            where = f"{tag}/{self.split_name(name, direction)}"
            split = self.split(name, direction)
            split.check_fits(where, max_positions, self.max_tokens, self.pad_to_multiple)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.source_name}, {self.src_lang}->{self.tgt_lang}, "
            f"vocab={self.vocab_size}, root={os.fspath(self.root) if self.root else None})"
        )


# Data settings that checkpoints of earlier versions store under another name -> the name now
RENAMED_SETTINGS = {"eval_max_tokens": "validation_max_tokens"}


def stored_settings(ckpt: Mapping[str, Any]) -> dict[str, Any]:
    """A checkpoint's data settings (``datamodule_hyper_parameters``) under today's names."""
    settings = ckpt.get("datamodule_hyper_parameters") or {}
    return {RENAMED_SETTINGS.get(key, key): value for key, value in settings.items()}


def checkpoint_texts(
    ckpt: Mapping[str, Any], given: Mapping[str, Any], missing: UserError, invalid: str
) -> CorpusTexts:
    """The texts of a checkpoint's corpus (evaluation, pruning): its data settings, ``given`` ones
    (e.g. ``root``) in their place, checked as training checks them; nothing read yet. ``missing``
    is raised where it records no corpus (none, or an imported model's languages alone) and
    ``given`` names no ``source``; an invalid option is a :class:`ConfigError`: ``invalid``, then
    the data module's message."""
    settings = stored_settings(ckpt)
    if "source" not in settings and "source" not in given:  # none, or an imported model's
        raise missing
    try:
        return TranslationDataModule(**{**settings, **given}).texts
    except ValueError as err:
        raise ConfigError(f"{invalid}: {err}") from err
