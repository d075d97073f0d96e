"""The LightningDataModule: raw parallel text -> SentencePiece -> cached token ids -> batches."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.trainer.states import TrainerFn
from torch.utils.data import DataLoader

from transformer.atomic import sweep_temporaries
from transformer.data.collate import Buckets, Collator, padded_sizes
from transformer.data.corpora import (
    Corpus,
    make_corpora,
    prefix_tokens,
    special_tokens,
    validated,
)
from transformer.data.sampler import TokenBudgetBatchSampler
from transformer.data.text_files import ParallelText, checked
from transformer.data.token_cache import (
    CACHE_FORMAT,
    ConcatSplit,
    DamagedCache,
    TokenizedSplit,
    build_split,
    fingerprint,
)
from transformer.data.tokenizer import (
    PAD_ID,
    SPM_TRAIN_SENTENCES,
    SentenceSample,
    Tokenizer,
    train_tokenizer,
)
from transformer.data.tokenizer_files import TokenizerFiles, save_missing
from transformer.errors import DataError, Interrupted

log = logging.getLogger(__name__)


@contextlib.contextmanager
def _interruptible(what: str) -> Iterator[None]:
    """Inside the block, SIGINT and SIGTERM raise :class:`Interrupted`: the exception removes the
    temporaries being written on its way out (SIGTERM's default ends the process on the spot;
    Lightning installs its own handler only after data preparation). The previous handlers come
    back after the block."""
    if threading.current_thread() is not threading.main_thread():  # (only it can set them)
        yield
        return

    def stop(signum: int, frame: object) -> None:
        name = signal.Signals(signum).name
        raise Interrupted(
            f"{name} during {what}: stopped; what was finished is kept and nothing half-written "
            "is left; run the same command again to go on",
            signum,
        )

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)


class TranslationDataModule(L.LightningDataModule):
    """Batches of one translation direction of a parallel corpus, or of several corpora and
    directions (``corpora``, ``target_token``: :mod:`transformer.data.corpora`).

    ``prepare_data`` (once per node) downloads what is missing, reads and checks the raw text,
    trains the SentencePiece model(s) on the training split and tokenizes every split into
    ``cache_dir``; a later run with the same data and settings finds all of it there and does none
    of this work. ``setup`` loads the tokenizers and token ids (building them first if
    ``prepare_data`` was not called).

    Caches, under ``cache_dir``: ``spm/<corpus>.<langs>.<type><vocab>.<hash>.model`` (the hash
    covers the training split's identity and the tokenizer settings) and
    ``tok/<corpus>.<split>.<src>-<tgt>.<hash>/`` (covering the split's identity, what the
    tokenizers do, :attr:`Tokenizer.digest`, and ``max_len``). A raw file's identity is its path,
    size and mtime. Tokenizers given by :meth:`use_tokenizers` (a checkpoint's, when resuming)
    replace the trained ones and are saved as ``spm/<corpus>.<langs>.<digest>.model``.

    Training pairs with an empty side or more than ``max_len`` pieces on a side are dropped (and
    counted in the log); validation and test splits are kept whole, in corpus order, so that
    ``Batch.ids`` index ``references(split)``. Under DDP the trainer needs
    ``use_distributed_sampler=False``: the batch sampler shards by itself.

    With several corpora the SentencePiece models train on all their training splits, each
    corpus's splits are cached apart, training samples them by their weights, and validation and
    test run per direction (:attr:`directions`; the stage aliases ``val``/``test`` then take a
    ``direction``, the first by default).

    ``eval_max_tokens`` (training's ``validation.max_tokens``) is the token budget of validation
    and test batches, ``max_tokens`` when None: larger ones keep a GPU busy while validation
    decodes.
    """

    def __init__(
        self,
        source: str = "multi30k",
        root: str | None = "data/multi30k",
        src_lang: str = "en",
        tgt_lang: str = "de",
        vocab_size: int = 8000,
        spm_model_type: str = "unigram",
        joint_vocab: bool = True,
        spm_train_sentences: int = SPM_TRAIN_SENTENCES,
        max_tokens: int | None = 4096,
        eval_max_tokens: int | None = None,
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
        hf_name: str | None = None,
        hf_config: str | None = None,
        hf_path: str | None = None,
        download: bool = True,
        prepare_per_node: bool = True,
        corpora: list[dict[str, Any]] | None = None,
        target_token: bool = False,
    ) -> None:
        super().__init__()
        if max_len < 1:
            raise ValueError(f"max_len must be positive, got {max_len}")
        if max_tokens is not None and max_tokens < max_len + 1:
            raise ValueError(
                f"max_tokens={max_tokens} cannot hold one sentence of max_len={max_len} pieces "
                f"(+1 for bos/eos); raise data.max_tokens or lower data.max_len"
            )
        if max_tokens is None and not batch_size:
            raise ValueError("set data.max_tokens (token budget) or data.batch_size (sentences)")
        if isinstance(num_buckets, bool) or not isinstance(num_buckets, int) or num_buckets < 0:
            raise ValueError(
                f"num_buckets must be a count >= 0 (0: no shape buckets), got {num_buckets!r}"
            )
        if eval_max_tokens is not None and (max_tokens is None or eval_max_tokens < max_len + 1):
            raise ValueError(
                f"validation.max_tokens={eval_max_tokens} needs token-budget batches "
                f"(data.max_tokens) and room for one sentence of max_len={max_len} pieces (+1); "
                "raise it, or set it to null (data.max_tokens)"
            )
        if corpora is not None:  # plain lists and dicts: checkpoints load no Hydra containers
            corpora = [dict(e) if isinstance(e, Mapping) else e for e in corpora]
        self.save_hyperparameters()  # stored in checkpoints: evaluation reads the same corpus
        # Lightning's switch: True builds the caches on every node (local disks), False on the
        # first node only (a cache_dir on a file system all nodes share).
        self.prepare_data_per_node = prepare_per_node
        self.source_name, self.root = source, root
        self.src_lang, self.tgt_lang = src_lang, tgt_lang
        self.vocab_size, self.joint_vocab = vocab_size, joint_vocab
        self.max_tokens, self.batch_size, self.max_len = max_tokens, batch_size, max_len
        self.eval_max_tokens = eval_max_tokens or max_tokens  # validation and test batches
        self.pad_to_multiple, self.num_workers, self.seed = pad_to_multiple, num_workers, seed
        self.num_buckets = num_buckets
        self.cache_dir = Path(cache_dir)
        # Built now (reading nothing), so that their checks of the options run before data work.
        self.corpora: list[Corpus] = make_corpora(
            corpora,
            {
                "source": source, "root": root, "src_lang": src_lang, "tgt_lang": tgt_lang,
                "train_split": train_split, "val_split": val_split, "test_split": test_split,
                "hf_name": hf_name, "hf_config": hf_config, "hf_path": hf_path,
                "download": download,
            },
        )  # fmt: skip
        self.target_token = target_token
        self._validated = validated(self.corpora)  # direction -> its corpus for val and test
        self.directions = list(self._validated)
        src_langs = sorted({c.source.src_lang for c in self.corpora})
        tgt_langs = sorted({c.source.tgt_lang for c in self.corpora})
        self.tokenizer_files = TokenizerFiles(
            self.cache_dir / "spm", "+".join(dict.fromkeys(c.source.tag for c in self.corpora)),
            "-".join(src_langs), "-".join(tgt_langs), vocab_size, spm_model_type, joint_vocab,
            spm_train_sentences, special_tokens(self.corpora, target_token),
        )  # fmt: skip
        self._splits: dict[tuple[int, str], TokenizedSplit] = {}  # (corpus, split) ->
        self._train: TokenizedSplit | ConcatSplit | None = None  # all training pairs
        self._train_parts: list[TokenizedSplit] = []  # each corpus's
        self._texts: dict[tuple[int, str], ParallelText] = {}
        self.src_tokenizer: Tokenizer | None = None
        self.tgt_tokenizer: Tokenizer | None = None
        self._checkpoint_tokenizers: tuple[Tokenizer, Tokenizer] | None = None
        self._train_sampler: TokenBudgetBatchSampler | None = None
        self._sampler_state: dict[str, int] | None = None

    # -- sizes the model needs before setup --------------------------------------------------

    @property
    def src_vocab_size(self) -> int:
        return self.vocab_size

    @property
    def tgt_vocab_size(self) -> int:
        return self.vocab_size

    @property
    def pad_id(self) -> int:
        return PAD_ID

    # -- building ----------------------------------------------------------------------------

    def _corpus(self, direction: str | None) -> int:
        """The corpus that validates ``direction`` (None: the first direction)."""
        if direction is None:
            return 0
        if direction not in self._validated:
            raise DataError(
                f"no corpus translates {direction}; the directions are {self.directions}"
            )
        return self._validated[direction]

    def _splits_of(self, c: int) -> list[str]:
        """Corpus ``c``'s splits: its training split, and if it validates its direction its val
        and test splits."""
        corpus = self.corpora[c]
        if self._validated[corpus.direction] != c:
            return [corpus.splits["train"]]
        return list(dict.fromkeys(corpus.splits.values()))

    def split_name(self, name: str, direction: str | None = None) -> str:
        """The split a stage alias (``train``/``val``/``test``) names in ``direction``'s corpus;
        any other name as it is."""
        return self.corpora[self._corpus(direction)].splits.get(name, name)

    def source_prefix(self, direction: str | None = None) -> tuple[str, ...]:
        """The tokens before each source sentence translated in ``direction``: its target token
        with ``target_token``, else none (``Tokenizer.with_prefix`` puts them there)."""
        corpus = self.corpora[self._corpus(direction)]
        return prefix_tokens(corpus, self.target_token, training=False)

    def use_tokenizers(self, src: bytes, tgt: bytes, checkpoint: str | os.PathLike) -> None:
        """Use the SentencePiece models ``checkpoint`` was trained with (``src``, ``tgt``: their
        bytes, equal for a joint vocabulary) instead of training them; call before
        ``prepare_data``/``setup``.

        A model trained again (on another machine, or on files changed or copied since) can map
        the model's ids to other pieces: a resumed run must use the checkpoint's. Their sizes
        must be ``vocab_size``.
        """
        if self._splits:
            raise RuntimeError("use_tokenizers() must come before prepare_data() and setup()")
        self._checkpoint_tokenizers = self.tokenizer_files.from_checkpoint(src, tgt, checkpoint)
        log.info("using the tokenizers of checkpoint %s, not training SentencePiece", checkpoint)

    def _prefix(self, c: int, split: str) -> tuple[str, ...]:
        corpus = self.corpora[c]
        return prefix_tokens(corpus, self.target_token, training=split == corpus.splits["train"])

    def _split_path(self, c: int, split: str, identity: str, tok_digest: str) -> Path:
        corpus, prefix = self.corpora[c], self._prefix(c, split)
        filtered = split == corpus.splits["train"]
        parts = (CACHE_FORMAT, identity, tok_digest, self.max_len if filtered else None)
        key = fingerprint(*parts, prefix) if prefix else fingerprint(*parts)
        pair = f"{corpus.source.src_lang}-{corpus.source.tgt_lang}"
        return self.cache_dir / "tok" / f"{corpus.source.tag}.{split}.{pair}.{key}"

    def _read(self, split: str, c: int = 0) -> ParallelText:
        """A split's pairs, all of them, checked (kept: validation and test texts are BLEU's
        references and small; the training split is only ever streamed, :meth:`_chunks`)."""
        if (c, split) not in self._texts:
            origin = self.corpora[c].source.origin(split)
            self._texts[c, split] = ParallelText.join(self._chunks(split, c), origin)
        return self._texts[c, split]

    def _chunks(self, split: str, c: int = 0) -> Iterator[ParallelText]:
        """A split's pairs as the source streams them, checked on the way."""
        if (c, split) in self._texts:
            return iter([self._texts[c, split]])
        source = self.corpora[c].source
        langs = source.src_lang, source.tgt_lang
        return checked(source.read_chunks(split), split, langs, source.origin(split))

    def _tokenizers(self, train_identity: str) -> tuple[Tokenizer, Tokenizer]:
        """The checkpoint's tokenizers (saved into the cache), else those trained on the training
        split (trained now unless cached)."""
        if self._checkpoint_tokenizers is not None:
            save_missing(self._checkpoint_tokenizers)
            return self._checkpoint_tokenizers
        src_path, tgt_path = self.tokenizer_files.trained_paths(train_identity)
        if not (src_path.exists() and tgt_path.exists()):
            files = self.tokenizer_files
            settings = files.vocab_size, files.model_type, files.train_sentences, files.symbols
            for c, corpus in enumerate(self.corpora):  # the small splits before the long work
                for s in self._splits_of(c):
                    if s != corpus.splits["train"]:
                        self._read(s, c)
            # One pass over the training splits checks them and draws SentencePiece's sample(s).
            samples = [
                SentenceSample(files.train_sentences) for _ in range(1 if self.joint_vocab else 2)
            ]
            for c, corpus in enumerate(self.corpora):
                for part in self._chunks(corpus.splits["train"], c):
                    samples[0].add(part.src)
                    samples[-1].add(part.tgt)
            paths = [src_path] if self.joint_vocab else [src_path, tgt_path]
            for path, sample in zip(paths, samples, strict=True):
                if not path.exists():
                    train_tokenizer(sample.sentences, path, *settings)
        return self.tokenizer_files.load(src_path, tgt_path)

    def _build(self) -> None:
        """Make sure tokenizers and token-id caches exist, building only what is missing (or
        damaged), and load them. Ctrl-C or SIGTERM stop it with :class:`Interrupted`, leaving
        no temporary behind; those of killed runs are removed first."""
        for folder in ("spm", "tok"):
            for path in sweep_temporaries(self.cache_dir / folder):
                log.info("removed %s, left by a process that no longer runs", path)
        with _interruptible("data preparation"):
            self._build_caches()

    def _build_caches(self) -> None:
        keys = [(c, s) for c in range(len(self.corpora)) for s in self._splits_of(c)]
        for c, corpus in enumerate(self.corpora):
            corpus.source.prepare(self._splits_of(c))
        identities = {(c, s): self.corpora[c].source.identity(s) for c, s in keys}
        trains = [(c, corpus.splits["train"]) for c, corpus in enumerate(self.corpora)]
        train_identity = "+".join(identities[key] for key in trains)
        self.src_tokenizer, self.tgt_tokenizer = self._tokenizers(train_identity)
        tok_digest = "+".join(t.digest for t in (self.src_tokenizer, self.tgt_tokenizer))
        paths = {(c, s): self._split_path(c, s, identities[c, s], tok_digest) for c, s in keys}
        splits: dict[tuple[int, str], TokenizedSplit] = {}
        for key in keys:
            if paths[key].exists():
                try:
                    splits[key] = TokenizedSplit.load(paths[key])
                    log.info("%s/%s: token ids from cache %s", self._tag(key), key[1], paths[key])
                except DamagedCache as err:  # made again from the text
                    log.warning("%s: building it again", err)
                    shutil.rmtree(paths[key])
        missing = [key for key in keys if key not in splits]
        for c, s in missing:  # the small splits first: bad input fails before the long work
            if (c, s) not in trains:
                self._read(s, c)
        for c, s in missing:
            build_split(
                self._chunks(s, c),
                self.src_tokenizer.with_prefix(self._prefix(c, s)),
                self.tgt_tokenizer,
                paths[c, s],
                self.max_len if (c, s) in trains else None,
                f"{self._tag((c, s))}/{s}",
            )
            splits[c, s] = TokenizedSplit.load(paths[c, s])
        self._splits = splits
        parts = self._train_parts = [splits[key] for key in trains]
        self._train = parts[0] if len(parts) == 1 else ConcatSplit(parts)

    def _tag(self, key: tuple[int, str]) -> str:
        return self.corpora[key[0]].source.tag

    def prepare_data(self) -> None:
        self._build()

    def setup(self, stage: str | None = None) -> None:
        if not self._splits:
            self._build()

    # -- loading -----------------------------------------------------------------------------

    def split(self, name: str, direction: str | None = None) -> TokenizedSplit | ConcatSplit:
        """The tokenized split for a stage alias (``train``/``val``/``test``) or a split name;
        ``train`` holds every corpus's training pairs, the others are ``direction``'s."""
        if name == "train":
            return self._train
        return self._splits[self._corpus(direction), self.split_name(name, direction)]

    def check_fits(self, name: str, max_positions: int) -> None:
        """Refuse a split (kept whole, unlike training's) that has a pair the model cannot take
        or that does not fit a batch of ``max_tokens``, in any direction:
        :meth:`TokenizedSplit.check_fits`."""
        for direction in self.directions:
            tag = self.corpora[self._corpus(direction)].source.tag
            where = f"{tag}/{self.split_name(name, direction)}"
            split = self.split(name, direction)
            split.check_fits(where, max_positions, self.max_tokens, self.pad_to_multiple)

    def _sampler(
        self,
        data: TokenizedSplit | ConcatSplit,
        shuffle: bool,
        max_tokens: int | None,
        weights: list[tuple[int, float]] | None = None,
        buckets: Buckets | None = None,
    ) -> TokenBudgetBatchSampler:
        sizes = padded_sizes(data.src_lens, data.tgt_lens)
        return TokenBudgetBatchSampler(
            *sizes,
            max_tokens=max_tokens,
            batch_size=self.batch_size,
            shuffle=shuffle,
            seed=self.seed,
            pad_to_multiple=self.pad_to_multiple,
            weights=weights,
            buckets=buckets,
        )

    def train_buckets(self) -> Buckets | None:
        """The shapes training batches are padded to (``num_buckets`` of them, at quantiles of
        the training pairs' lengths), or None (``num_buckets=0``)."""
        if not self.num_buckets:
            return None
        data = self.split("train")
        sizes = np.maximum(*padded_sizes(data.src_lens, data.tgt_lens))
        return Buckets.at_quantiles(
            sizes, self.num_buckets, self.pad_to_multiple, self.max_tokens, self.batch_size
        )

    def _loader(
        self,
        data: TokenizedSplit | ConcatSplit,
        sampler: TokenBudgetBatchSampler,
        buckets: Buckets | None = None,
    ) -> DataLoader:
        # Each iterator draws its workers' seed from ``generator``: without one it would draw from
        # torch's global stream, which dropout uses, so a validation loader started after a
        # checkpoint saved that stream would shift a resumed run's dropout.
        return DataLoader(
            data,
            batch_sampler=sampler,
            collate_fn=Collator(self.pad_to_multiple, PAD_ID, buckets),
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            pin_memory=self._on_cuda(),
            generator=torch.Generator().manual_seed(self.seed),
        )

    def _on_cuda(self) -> bool:
        """Whether the attached trainer runs on a CUDA device (pinned batches copy to it faster;
        anywhere else pinning is wasted work)."""
        return self.trainer is not None and self.trainer.strategy.root_device.type == "cuda"

    def train_dataloader(self) -> DataLoader:
        weights = None  # each pair once an epoch, unless a corpus's weight says otherwise
        if any(c.weight != 1 for c in self.corpora):
            parts = zip(self._train_parts, self.corpora, strict=True)
            weights = [(len(part), corpus.weight) for part, corpus in parts]
        buckets = self.train_buckets()
        if buckets is not None:
            log.info(
                "training batches padded to %d shapes (rows x length): %s",
                len(buckets.lengths),
                buckets,
            )
        train = self.split("train")
        self._train_sampler = self._sampler(
            train, shuffle=True, max_tokens=self.max_tokens, weights=weights, buckets=buckets
        )
        if self._sampler_state is not None:
            self._train_sampler.load_state_dict(self._sampler_state)
            self._sampler_state = None
        return self._loader(train, self._train_sampler, buckets)

    def _eval_loaders(self, name: str) -> DataLoader | list[DataLoader]:
        """One loader per direction (one direction: the loader itself), in :attr:`directions`'
        order."""
        splits = [self.split(name, d) for d in self.directions]
        budget = self.eval_max_tokens
        loaders = [self._loader(x, self._sampler(x, False, budget)) for x in splits]
        return loaders[0] if len(loaders) == 1 else loaders

    def val_dataloader(self) -> DataLoader | list[DataLoader]:
        return self._eval_loaders("val")

    def test_dataloader(self) -> DataLoader | list[DataLoader]:
        return self._eval_loaders("test")

    # -- texts for BLEU and translation ------------------------------------------------------

    def references(self, split: str, direction: str | None = None) -> list[str]:
        """Target-side texts of a split of ``direction``, in corpus order (index =
        ``Batch.ids``)."""
        return self._read(self.split_name(split, direction), self._corpus(direction)).tgt

    def sources(self, split: str, direction: str | None = None) -> list[str]:
        """Source-side texts of a split of ``direction``, in corpus order (index = ``Batch.ids``),
        as the files have them (without :meth:`source_prefix`)."""
        return self._read(self.split_name(split, direction), self._corpus(direction)).src

    # -- checkpointing -----------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The train sampler's epoch, position and seed.

        During fitting (checkpoints saved after a training batch or after validation) the position
        is the number of batches the trainer has finished in the current epoch, not the sampler's
        own count, which runs ahead by the batches that DataLoader workers and Lightning have
        prefetched.
        """
        if self._train_sampler is None:
            return {"train_sampler": self._sampler_state} if self._sampler_state else {}
        state = self._train_sampler.state_dict()
        trainer = self.trainer
        if trainer is not None and trainer.state.fn == TrainerFn.FITTING:
            state["epoch"] = trainer.current_epoch
            state["position"] = trainer.fit_loop.epoch_loop.batch_progress.current.processed
        return {"train_sampler": state}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state = state_dict.get("train_sampler")
        if state is None:
            return
        if self._train_sampler is not None:
            self._train_sampler.load_state_dict(state)
        else:
            self._sampler_state = dict(state)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.source_name}, {self.src_lang}->{self.tgt_lang}, "
            f"vocab={self.vocab_size}, root={os.fspath(self.root) if self.root else None})"
        )
