"""The LightningDataModule: raw parallel text -> SentencePiece -> cached token ids -> batches."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.trainer.states import TrainerFn
from torch.utils.data import DataLoader

from transformer.data.collate import Collator, padded_sizes
from transformer.data.sampler import TokenBudgetBatchSampler
from transformer.data.sources import DEFAULT_SPLITS, make_source
from transformer.data.text_files import ParallelText, checked
from transformer.data.token_cache import (
    CACHE_FORMAT,
    TokenizedSplit,
    build_split,
    file_digest,
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

log = logging.getLogger(__name__)


class TranslationDataModule(L.LightningDataModule):
    """Batches of one translation direction of a parallel corpus.

    ``prepare_data`` (once per node) downloads what is missing, reads and checks the raw text,
    trains the SentencePiece model(s) on the training split and tokenizes every split into
    ``cache_dir``; a later run with the same data and settings finds all of it there and does none
    of this work. ``setup`` loads the tokenizers and token ids (building them first if
    ``prepare_data`` was not called).

    Caches, under ``cache_dir``: ``spm/<corpus>.<langs>.<type><vocab>.<hash>.model`` (the hash
    covers the training split's identity and the tokenizer settings) and
    ``tok/<corpus>.<split>.<src>-<tgt>.<hash>/`` (covering the split's identity, the tokenizer
    files' contents and ``max_len``). A raw file's identity is its path, size and mtime.
    Tokenizers given by :meth:`use_tokenizers` (a checkpoint's, when resuming) replace the trained
    ones and are saved as ``spm/<corpus>.<langs>.<hash>.model``, the hash of their contents.

    Training pairs with an empty side or more than ``max_len`` pieces on a side are dropped (and
    counted in the log); validation and test splits are kept whole, in corpus order, so that
    ``Batch.ids`` index ``references(split)``. Under DDP the trainer needs
    ``use_distributed_sampler=False``: the batch sampler shards by itself.
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
        batch_size: int | None = 64,
        max_len: int = 128,
        pad_to_multiple: int = 1,
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
    ) -> None:
        super().__init__()
        if source not in DEFAULT_SPLITS:
            raise ValueError(f"source must be one of {list(DEFAULT_SPLITS)}, got {source!r}")
        if max_len < 1:
            raise ValueError(f"max_len must be positive, got {max_len}")
        if max_tokens is not None and max_tokens < max_len + 1:
            raise ValueError(
                f"max_tokens={max_tokens} cannot hold one sentence of max_len={max_len} pieces "
                f"(+1 for bos/eos); raise data.max_tokens or lower data.max_len"
            )
        if max_tokens is None and not batch_size:
            raise ValueError("set data.max_tokens (token budget) or data.batch_size (sentences)")
        if source in ("multi30k", "local") and root is None:
            raise ValueError(f"data={source} needs data.root, the directory with the files")
        self.save_hyperparameters()  # stored in checkpoints: evaluation reads the same corpus
        # Lightning's switch: True builds the caches on every node (local disks), False on the
        # first node only (a cache_dir on a file system all nodes share).
        self.prepare_data_per_node = prepare_per_node
        self.source_name, self.root = source, root
        self.src_lang, self.tgt_lang = src_lang, tgt_lang
        self.vocab_size, self.joint_vocab = vocab_size, joint_vocab
        self.max_tokens, self.batch_size, self.max_len = max_tokens, batch_size, max_len
        self.pad_to_multiple, self.num_workers, self.seed = pad_to_multiple, num_workers, seed
        self.cache_dir = Path(cache_dir)
        defaults = DEFAULT_SPLITS[source]
        self.split_names = {
            "train": train_split or defaults[0],
            "val": val_split or defaults[1],
            "test": test_split or defaults[2],
        }
        # Built now (reading nothing), so that their checks of the options run before data work.
        self.source = make_source(
            source, root, src_lang, tgt_lang, download, hf_name, hf_config, hf_path
        )
        self.tokenizer_files = TokenizerFiles(
            self.cache_dir / "spm", self.source.tag, src_lang, tgt_lang, vocab_size,
            spm_model_type, joint_vocab, spm_train_sentences,
        )  # fmt: skip
        self._splits: dict[str, TokenizedSplit] = {}
        self._texts: dict[str, ParallelText] = {}
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

    def _split_list(self) -> list[str]:
        return list(dict.fromkeys(self.split_names.values()))

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

    def _split_path(self, split: str, identity: str, tok_digest: str, filtered: bool) -> Path:
        key = fingerprint(CACHE_FORMAT, identity, tok_digest, self.max_len if filtered else None)
        pair = f"{self.src_lang}-{self.tgt_lang}"
        return self.cache_dir / "tok" / f"{self.source.tag}.{split}.{pair}.{key}"

    def _read(self, split: str) -> ParallelText:
        """A split's pairs, all of them, checked (kept: validation and test texts are BLEU's
        references and small; the training split is only ever streamed, :meth:`_chunks`)."""
        if split not in self._texts:
            self._texts[split] = ParallelText.join(self._chunks(split), self.source.origin(split))
        return self._texts[split]

    def _chunks(self, split: str) -> Iterator[ParallelText]:
        """A split's pairs as the source streams them, checked on the way."""
        if split in self._texts:
            return iter([self._texts[split]])
        langs = self.src_lang, self.tgt_lang
        return checked(self.source.read_chunks(split), split, langs, self.source.origin(split))

    def _tokenizers(self, train_identity: str) -> tuple[Tokenizer, Tokenizer]:
        """The checkpoint's tokenizers (saved into the cache), else those trained on the training
        split (trained now unless cached)."""
        if self._checkpoint_tokenizers is not None:
            save_missing(self._checkpoint_tokenizers)
            return self._checkpoint_tokenizers
        src_path, tgt_path = self.tokenizer_files.trained_paths(train_identity)
        if not (src_path.exists() and tgt_path.exists()):
            files = self.tokenizer_files
            settings = files.vocab_size, files.model_type, files.train_sentences
            train = self.split_names["train"]
            for s in self._split_list():  # check the small splits before the long work
                if s != train:
                    self._read(s)
            # One pass over the training split checks it and draws SentencePiece's sample(s).
            samples = [
                SentenceSample(files.train_sentences) for _ in range(1 if self.joint_vocab else 2)
            ]
            for part in self._chunks(train):
                samples[0].add(part.src)
                samples[-1].add(part.tgt)
            paths = [src_path] if self.joint_vocab else [src_path, tgt_path]
            for path, sample in zip(paths, samples, strict=True):
                if not path.exists():
                    train_tokenizer(sample.sentences, path, *settings)
        return self.tokenizer_files.load(src_path, tgt_path)

    def _build(self) -> None:
        """Make sure tokenizers and token-id caches exist, building only what is missing, and
        load them."""
        source, splits = self.source, self._split_list()
        train = self.split_names["train"]
        source.prepare(splits)
        identities = {s: source.identity(s) for s in splits}
        self.src_tokenizer, self.tgt_tokenizer = self._tokenizers(identities[train])
        tok_digest = "+".join(
            file_digest(t.model_path) for t in (self.src_tokenizer, self.tgt_tokenizer)
        )
        paths = {
            s: self._split_path(s, identities[s], tok_digest, filtered=s == train) for s in splits
        }
        missing = [s for s in splits if not paths[s].exists()]
        for s in missing:  # the small splits first: bad input fails before the long work
            if s != train:
                self._read(s)
        for s in missing:
            build_split(
                self._chunks(s),
                self.src_tokenizer,
                self.tgt_tokenizer,
                paths[s],
                self.max_len if s == train else None,
                f"{source.tag}/{s}",
            )
        for s in splits:
            if s not in missing:
                log.info("%s/%s: token ids from cache %s", source.tag, s, paths[s])
            self._splits[s] = TokenizedSplit.load(paths[s])

    def prepare_data(self) -> None:
        self._build()

    def setup(self, stage: str | None = None) -> None:
        if not self._splits:
            self._build()

    # -- loading -----------------------------------------------------------------------------

    def split(self, name: str) -> TokenizedSplit:
        """The tokenized split for a stage alias (``train``/``val``/``test``) or a split name."""
        return self._splits[self.split_names.get(name, name)]

    def check_fits(self, name: str, max_positions: int) -> None:
        """Refuse a split (kept whole, unlike training's) that has a pair the model cannot take:
        :meth:`TokenizedSplit.check_fits`."""
        split = self.split_names.get(name, name)
        self.split(name).check_fits(f"{self.source.tag}/{split}", max_positions)

    def _sampler(self, data: TokenizedSplit, shuffle: bool) -> TokenBudgetBatchSampler:
        sizes = padded_sizes(data.src_lens, data.tgt_lens)
        return TokenBudgetBatchSampler(
            *sizes,
            max_tokens=self.max_tokens,
            batch_size=self.batch_size,
            shuffle=shuffle,
            seed=self.seed,
            pad_to_multiple=self.pad_to_multiple,
        )

    def _loader(self, data: TokenizedSplit, sampler: TokenBudgetBatchSampler) -> DataLoader:
        # Each iterator draws its workers' seed from ``generator``: without one it would draw from
        # torch's global stream, which dropout uses, so a validation loader started after a
        # checkpoint saved that stream would shift a resumed run's dropout.
        return DataLoader(
            data,
            batch_sampler=sampler,
            collate_fn=Collator(self.pad_to_multiple, PAD_ID),
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
        self._train_sampler = self._sampler(self.split("train"), shuffle=True)
        if self._sampler_state is not None:
            self._train_sampler.load_state_dict(self._sampler_state)
            self._sampler_state = None
        return self._loader(self.split("train"), self._train_sampler)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.split("val"), self._sampler(self.split("val"), shuffle=False))

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.split("test"), self._sampler(self.split("test"), shuffle=False))

    # -- texts for BLEU and translation ------------------------------------------------------

    def references(self, split: str) -> list[str]:
        """Target-side texts of a split, in corpus order (index = ``Batch.ids``)."""
        return self._read(self.split_names.get(split, split)).tgt

    def sources(self, split: str) -> list[str]:
        """Source-side texts of a split, in corpus order (index = ``Batch.ids``)."""
        return self._read(self.split_names.get(split, split)).src

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
