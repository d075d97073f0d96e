"""The data module's batches (:class:`transformer.data.datamodule.TranslationDataModule`): its
DataLoaders of token-budget batches, padded to buckets or segmented anew each epoch, and the
training sampler's position, saved in checkpoints so that a resumed run goes on with the batch
after the last one trained."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch
from lightning.pytorch.trainer.states import TrainerFn
from torch.utils.data import DataLoader

from transformer.data.collate import Buckets, Collator, padded_sizes
from transformer.data.sampler import TokenBudgetBatchSampler
from transformer.data.subword_sampling import RowLimit, SampledSplit
from transformer.data.token_cache import ConcatSplit, TokenizedSplit
from transformer.data.tokenizer import PAD_ID

log = logging.getLogger(__name__)


class Batches:
    """The LightningDataModule hooks that load batches, for :class:`TranslationDataModule` (whose
    options, splits and tokenizers they read) to inherit before ``L.LightningDataModule``."""

    # -- loaders -----------------------------------------------------------------------------

    def train_buckets(self, sizes: tuple[np.ndarray, np.ndarray] | None = None) -> Buckets | None:
        """The shapes training batches are padded to (``num_buckets`` of them, at quantiles of
        the training pairs' row ``sizes``, source and target, by default the cached ones), or
        None (``num_buckets=0``)."""
        if not self.num_buckets:
            return None
        if sizes is None:
            data = self.split("train")
            sizes = padded_sizes(data.src_lens, data.tgt_lens)
        return Buckets.at_quantiles(
            np.maximum(*sizes), self.num_buckets, self.pad_to_multiple, self.max_tokens,
            self.batch_size,
        )  # fmt: skip

    def sampled_train(self) -> SampledSplit:
        """The training pairs segmented anew each epoch (``spm_sampling``), each corpus's with
        its tokenizers; its rows within ``max_len`` only (:meth:`SampledSplit.within`)."""
        parts = [
            (self._splits[c, s], self.src_tokenizer.with_prefix(self.texts.prefix(c, s)),
             self.tgt_tokenizer)
            for c, s in self._train_keys
        ]  # fmt: skip
        return SampledSplit(parts, self.sampling, self.seed, RowLimit(self.max_len))

    def _loader(
        self,
        data: TokenizedSplit | ConcatSplit | SampledSplit,
        max_tokens: int | None,
        shuffle: bool = False,
        weights: list[tuple[int, float]] | None = None,
        buckets: Buckets | None = None,
        sizes: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> DataLoader:
        """Batches of ``data`` planned for ``sizes`` (source and target rows; by default the
        cached ones)."""
        sampler = TokenBudgetBatchSampler(
            *(sizes or padded_sizes(data.src_lens, data.tgt_lens)), max_tokens=max_tokens,
            batch_size=self.batch_size, shuffle=shuffle, seed=self.seed,
            pad_to_multiple=self.pad_to_multiple, weights=weights, buckets=buckets,
            epochs=isinstance(data, SampledSplit),
        )  # fmt: skip
        # Each iterator draws its workers' seed from ``generator``: without one it would draw from
        # torch's global stream, which dropout uses, so a validation loader started after a
        # checkpoint saved that stream would shift a resumed run's dropout.
        return DataLoader(
            data, batch_sampler=sampler, collate_fn=Collator(self.pad_to_multiple, PAD_ID, buckets),
            num_workers=self.num_workers, persistent_workers=self.num_workers > 0,
            pin_memory=self._on_cuda(), generator=torch.Generator().manual_seed(self.seed),
        )  # fmt: skip

    def _on_cuda(self) -> bool:
        """Whether the attached trainer runs on a CUDA device (pinned batches copy to it faster;
        anywhere else pinning is wasted work)."""
        return self.trainer is not None and self.trainer.strategy.root_device.type == "cuda"

    def train_dataloader(self) -> DataLoader:
        weights = None  # each pair once an epoch, unless a corpus's weight says otherwise
        if any(c.weight != 1 for c in self.corpora):
            parts = zip(self._train_parts, self.corpora, strict=True)
            weights = [(len(part), corpus.weight) for part, corpus in parts]
        data, sizes = self.split("train"), None
        if self.sampling is not None:  # batches planned for the lengths sampling draws
            data = self.sampled_train()
            sizes = data.planned_sizes(*padded_sizes(data.data.src_lens, data.data.tgt_lens))
        buckets = self.train_buckets(sizes)
        if buckets is not None:
            shapes = len(buckets.lengths)
            log.info("training batches padded to %d shapes (rows x length): %s", shapes, buckets)
        if isinstance(data, SampledSplit):
            data = data.within(
                RowLimit(self.max_len, self.max_tokens, self.pad_to_multiple, buckets)
            )
        loader = self._loader(data, self.max_tokens, True, weights, buckets, sizes)
        self._train_sampler = loader.batch_sampler
        if self._sampler_state is not None:
            self._train_sampler.load_state_dict(self._sampler_state)
            self._sampler_state = None
        return loader

    def _eval_loaders(self, name: str) -> DataLoader | list[DataLoader]:
        """One loader per direction (one direction: the loader itself), in :attr:`directions`'
        order."""
        loaders = [
            self._loader(self.split(name, d), self.validation_max_tokens) for d in self.directions
        ]
        return loaders[0] if len(loaders) == 1 else loaders

    def val_dataloader(self) -> DataLoader | list[DataLoader]:
        return self._eval_loaders("val")

    def test_dataloader(self) -> DataLoader | list[DataLoader]:
        return self._eval_loaders("test")

    # -- checkpointing -----------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The train sampler's epoch, position and seed. During fitting (checkpoints saved after
        a training batch or after validation) the position is the number of batches the trainer
        has finished in the current epoch, not the sampler's own count, which runs ahead by the
        batches that DataLoader workers and Lightning have prefetched."""
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
