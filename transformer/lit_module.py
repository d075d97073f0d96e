"""The Lightning module: teacher-forced training with label smoothing, validation loss and BLEU."""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.utilities import GradClipAlgorithmType
from torch import Tensor

from transformer.config import TransformerConfig
from transformer.errors import NonFiniteLoss
from transformer.loss import label_smoothed_loss
from transformer.metrics import score_translations
from transformer.model import Transformer
from transformer.optim import build_optimizer, clip_gradients
from transformer.translate import DecodeOptions, decode_batch

log = logging.getLogger(__name__)


def host_scalar(x: float) -> Tensor:
    """A host number to ``self.log``: Lightning would copy a float to the GPU (a sync); a CPU
    tensor stays where it is."""
    return torch.tensor(float(x))


def hidden_states(model: Transformer, src: Tensor, tgt_in: Tensor, src_pad_mask: Tensor) -> Tensor:
    """Teacher-forced decoder states (B, T, D): the part of a step that ``torch.compile`` takes."""
    return model(src, tgt_in, src_pad_mask, return_hidden=True)


STRATEGIES = ("greedy", "beam")


@dataclass(frozen=True)
class ValidationDecoding:
    """How validation decodes for ``val/bleu``: the ``validation.decoding`` options, checked here
    and nowhere else (``train`` checks them through :meth:`from_dict` before any data work).

    ``strategy``: ``greedy`` (the default: cheapest) or ``beam``, beam search with ``beam_size``
    beams and length penalty ``len_penalty`` (score = log-probability / length ** len_penalty),
    as ``evaluate.py``'s ``decode`` options; ``beam_size`` and ``len_penalty`` are ignored by
    greedy. Either way at most ``max_len_a * source_length + max_len_b`` tokens.
    """

    strategy: str = "greedy"
    beam_size: int = 5
    len_penalty: float = 1.0
    max_len_a: float = 1.2
    max_len_b: int = 10

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(
                f"validation.decoding.strategy={self.strategy!r}; choose one of "
                + " or ".join(repr(s) for s in STRATEGIES)
            )
        for name, integer, low in (
            ("beam_size", True, 1),
            ("len_penalty", False, None),
            ("max_len_a", False, 0),
            ("max_len_b", True, 0),
        ):
            value = getattr(self, name)
            kinds = int if integer else (int, float)
            if isinstance(value, bool) or not isinstance(value, kinds) or not math.isfinite(value):
                kind = "an integer" if integer else "a number"
                raise ValueError(f"validation.decoding.{name} must be {kind}, got {value!r}")
            if low is not None and value < low:
                raise ValueError(f"validation.decoding.{name} must be >= {low}, got {value}")

    @classmethod
    def from_dict(cls, options: Mapping[str, Any] | None) -> ValidationDecoding:
        """From the ``validation.decoding`` mapping; an unknown key is a ValueError naming it."""
        known = [f.name for f in fields(cls)]
        for key in options or {}:
            if key not in known:
                raise ValueError(
                    f"unknown option validation.decoding.{key}; known: {', '.join(known)}"
                )
        return cls(**(options or {}))

    def options(self) -> DecodeOptions:
        """The same search as :class:`transformer.translate.DecodeOptions` (one hypothesis)."""
        beam = self.strategy == "beam"
        return DecodeOptions(
            beam_size=self.beam_size if beam else 1,
            len_penalty=self.len_penalty,
            max_len_a=self.max_len_a,
            max_len_b=self.max_len_b,
            min_len=1,
            nbest=1,
        )


class TranslationModule(L.LightningModule):
    """A :class:`Transformer` trained on :class:`transformer.data.collate.Batch` batches.

    Args:
        model: the :class:`TransformerConfig` fields, vocabulary sizes and pad id included.
        optimizer: partial optimizer taking parameter groups (Hydra ``_partial_: true``); its
            ``weight_decay`` applies to the decay group only.
        scheduler: partial taking the optimizer, returning a per-step LR scheduler.
        label_smoothing: epsilon of the label-smoothed cross entropy.
        decoding: validation decoding, the :class:`ValidationDecoding` fields: ``strategy``
            (``greedy`` or ``beam``), ``beam_size``, ``len_penalty``, ``max_len_a``,
            ``max_len_b``; missing ones take its defaults, invalid ones raise ValueError.
        val_bleu_sentences: decode the first N validation sentences for BLEU (None: all; 0: none).
        max_bad_steps: a step whose loss is NaN or inf is skipped (no update) and counted; this
            many in a row stop training with :class:`NonFiniteLoss`.
        compile_model: ``torch.compile`` the model's teacher-forced forward pass (dynamic shapes:
            token-budget batches of any shape share one graph). Only the training and validation
            loss use it; decoding and attention capture run the model as it is. The weights keep
            their names, so checkpoints load into an uncompiled model.
        compile_backend: ``torch.compile``'s backend: ``inductor`` generates kernels;
            ``aot_eager`` traces the same forward and backward graphs and runs them eagerly.
    """

    def __init__(
        self,
        model: dict[str, Any],
        optimizer: Callable[..., torch.optim.Optimizer] | None = None,
        scheduler: Callable[..., Any] | None = None,
        label_smoothing: float = 0.1,
        decoding: dict[str, Any] | None = None,
        val_bleu_sentences: int | None = None,
        max_bad_steps: int = 10,
        compile_model: bool = False,
        compile_backend: str = "inductor",
    ) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["optimizer", "scheduler"])
        self.cfg = TransformerConfig(**model)
        self.model = Transformer(self.cfg)
        # A compiled function, not a compiled module: nothing is registered under a new name
        # (no ``_orig_mod.`` in the state dict), and it always runs the current ``self.model``.
        self._hidden_states = (
            torch.compile(hidden_states, dynamic=True, backend=compile_backend)
            if compile_model
            else hidden_states
        )
        self.optimizer_factory, self.scheduler_factory = optimizer, scheduler
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing}")
        self.label_smoothing = label_smoothing
        self.decoding = ValidationDecoding.from_dict(decoding)
        self.val_bleu_sentences = val_bleu_sentences
        self.max_bad_steps = max_bad_steps
        self.skipped_steps = 0  # steps skipped for a NaN or inf loss, in the whole run
        self.bad_steps_in_a_row = 0  # both as counted so far: see count_bad_steps
        self._bad: Tensor | None = None  # this optimizer step's loss was NaN/inf (device bool)
        self._uncounted: list[tuple[int, Tensor]] = []  # (step, bad) not yet read on the host
        self._last_batch_time: float | None = None
        self._rng_to_restore: dict[str, Any] | None = None
        self._val_sums: Tensor | None = None
        self._val_hyps: dict[int, str] = {}

    # -- training ----------------------------------------------------------------------------

    def forward(self, src: Tensor, tgt_in: Tensor, src_pad_mask: Tensor | None = None) -> Tensor:
        return self.model(src, tgt_in, src_pad_mask)

    def _loss(self, batch) -> tuple[Tensor, Tensor, Tensor]:
        """Loss sum, NLL sum and count over the N non-pad labels; the output projection runs on
        those positions only, in chunks fused with the loss (never (B, T, V) logits)."""
        hidden = self._hidden_states(self.model, batch.src, batch.tgt_in, batch.src_pad_mask)
        # The collator counted the non-pad labels on the host: a static size, no device sync.
        return label_smoothed_loss(
            hidden, self.model.output.weight, batch.labels, self.label_smoothing,
            self.cfg.pad_id, batch.num_tgt_tokens,
        )  # fmt: skip

    def on_train_batch_start(self, batch, batch_idx: int) -> None:
        if self._rng_to_restore is not None:  # first step after a resume: continue the streams
            set_rng_states(self._rng_to_restore)
            self._rng_to_restore = None

    def training_step(self, batch, batch_idx: int) -> Tensor:
        loss_sum, nll_sum, ntok = self._loss(batch)
        ntok = ntok.clamp(min=1)
        loss = loss_sum / ntok
        # Nothing here waits for the device: a NaN/inf loss is only flagged, and every rank still
        # runs backward (DDP's all-reduce needs every rank); on_before_optimizer_step skips.
        bad = ~torch.isfinite(loss)
        self._bad = bad if self._bad is None else self._bad | bad  # any accumulated micro-batch
        now = time.perf_counter()
        bsz = len(batch.labels)
        self.log("train/loss", loss, prog_bar=True, batch_size=bsz)
        self.log("train/ppl", (nll_sum.detach() / ntok).clamp(max=50.0).exp(), batch_size=bsz)
        lr = host_scalar(self.optimizers().param_groups[0]["lr"])
        self.log("lr", lr, prog_bar=True, batch_size=bsz)
        if self._last_batch_time is not None:
            tps = batch.num_tgt_tokens * self.trainer.world_size / (now - self._last_batch_time)
            self.log("train/tokens_per_sec", host_scalar(tps), prog_bar=True, batch_size=bsz)
        self._last_batch_time = now
        return loss

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Skip the update of a step whose loss was NaN or inf, on every rank.

        A fused optimizer (AdamW ``fused=True``, the default on CUDA) skips on the device: its
        kernel reads ``found_inf``, the flag GradScaler uses, and the flags are read on the host
        (one sync) only at logging steps and checkpoints. Any other optimizer needs the decision
        on the host, one sync per step, to drop the gradients; fp16's GradScaler skips by itself.
        """
        bad, self._bad = self._bad, None
        if self.trainer.world_size > 1:  # a NaN on one rank skips the step on all of them
            bad = bad.int()
            torch.distributed.all_reduce(bad, op=torch.distributed.ReduceOp.MAX)
            bad = bad.bool()
        self._uncounted.append((self.global_step, bad))
        fp16 = self.trainer.precision == "16-mixed"
        on_device = getattr(optimizer, "_step_supports_amp_scaling", False)  # reads found_inf
        if not (fp16 or on_device) or self.global_step % self.trainer.log_every_n_steps == 0:
            self.count_bad_steps()
        self.log("train/skipped_steps", host_scalar(self.skipped_steps))
        if fp16:
            return
        if on_device:
            optimizer.found_inf = bad.float()  # 1: the fused kernel changes nothing
        elif self.bad_steps_in_a_row:
            optimizer.zero_grad(set_to_none=True)  # no gradients: the optimizer changes nothing

    def configure_gradient_clipping(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        """``trainer.gradient_clip_val`` for every precision, optimizer and strategy (Lightning's
        own clipping refuses fused AdamW under mixed precision: :func:`clip_gradients`); the norm
        before clipping is logged as ``train/grad_norm`` (a device tensor: no sync here)."""
        if not gradient_clip_val:
            return
        algorithm = GradClipAlgorithmType(gradient_clip_algorithm or "norm")
        norm = clip_gradients(self.trainer, optimizer, float(gradient_clip_val), algorithm)
        if norm is not None:
            self.log("train/grad_norm", norm)

    def count_bad_steps(self) -> int:
        """Read the pending NaN/inf flags on the host (one sync), update ``skipped_steps`` and
        ``bad_steps_in_a_row`` and return the latter; raise :class:`NonFiniteLoss` once
        ``max_bad_steps`` in a row were skipped. Called before every checkpoint is written."""
        if not self._uncounted:
            return self.bad_steps_in_a_row
        steps, flags = zip(*self._uncounted, strict=True)
        self._uncounted = []
        for step, bad in zip(steps, torch.stack(flags).tolist(), strict=True):
            if not bad:
                self.bad_steps_in_a_row = 0
                continue
            self.skipped_steps += 1
            self.bad_steps_in_a_row += 1
            log.warning(
                "step %d: loss is NaN or inf, step skipped (%d in a row, %d in all)",
                step, self.bad_steps_in_a_row, self.skipped_steps,
            )  # fmt: skip
            if self.bad_steps_in_a_row >= self.max_bad_steps:
                raise NonFiniteLoss(
                    f"the loss was NaN or inf for {self.bad_steps_in_a_row} steps in a row, the "
                    f"last at step {step}; training stopped. No checkpoint was written since the "
                    "last finite loss; lower optim.optimizer.lr, or raise loss.max_bad_steps"
                )
        return self.bad_steps_in_a_row

    def on_train_epoch_start(self) -> None:
        self._last_batch_time = None
        # Lightning calls ``set_epoch`` on ``dataloader.sampler`` and ``batch_sampler.sampler``
        # only, not on a batch sampler itself; tell a batch sampler here too, before the epoch's
        # first batch is drawn (same epoch = keep the position, as after a resume).
        sampler = getattr(self.trainer.train_dataloader, "batch_sampler", None)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(self.current_epoch)

    def configure_optimizers(self):
        if self.optimizer_factory is None:
            raise ValueError("TranslationModule needs an optimizer to train")
        wd = getattr(self.optimizer_factory, "keywords", {}).get("weight_decay", 0.0)
        optimizer = build_optimizer(self.model, self.optimizer_factory, wd)
        if self.scheduler_factory is None:
            return optimizer
        scheduler = self.scheduler_factory(optimizer)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step", "frequency": 1},
        }

    # -- validation --------------------------------------------------------------------------

    def on_validation_epoch_start(self) -> None:
        self._val_sums = torch.zeros(3, dtype=torch.float64, device=self.device)
        self._val_hyps = {}

    def validation_step(self, batch, batch_idx: int) -> None:
        loss_sum, nll_sum, ntok = self._loss(batch)
        self._val_sums += torch.stack([loss_sum.double(), nll_sum.double(), ntok.double()])
        if self.trainer.sanity_checking or self.val_bleu_sentences == 0:
            return
        keep = torch.ones_like(batch.ids, dtype=torch.bool)
        if self.val_bleu_sentences is not None:
            keep = batch.ids < self.val_bleu_sentences
        if not bool(keep.any()):
            return
        translations = decode_batch(
            self.model,
            self.trainer.datamodule.tgt_tokenizer,
            batch.src[keep],
            self.decoding.options(),
            batch.src_pad_mask[keep],
            always_beam=self.decoding.strategy == "beam",
        )
        for i, best in zip(batch.ids[keep].tolist(), translations, strict=True):
            self._val_hyps[i] = best[0].text if best else ""

    def on_validation_epoch_end(self) -> None:
        sums = self.trainer.strategy.reduce(self._val_sums, reduce_op="sum")
        loss_sum, nll_sum, ntok = sums.tolist()
        ntok = max(ntok, 1.0)
        self.log("val/loss", loss_sum / ntok, prog_bar=True, sync_dist=False)
        self.log("val/ppl", math.exp(min(nll_sum / ntok, 50.0)))
        if self.trainer.sanity_checking or self.val_bleu_sentences == 0:
            return
        hyps = self._val_hyps
        if self.trainer.world_size > 1:  # every rank decoded its own shard: gather them all
            parts: list[dict[int, str]] = [{} for _ in range(self.trainer.world_size)]
            torch.distributed.all_gather_object(parts, hyps)
            hyps = {k: v for part in parts for k, v in part.items()}
        if not hyps:
            return
        refs = self.trainer.datamodule.references("val")
        ids = sorted(hyps)
        scores = score_translations([hyps[i] for i in ids], [refs[i] for i in ids])
        self.log("val/bleu", scores.bleu, prog_bar=True)
        self.log("val/bleu_lc", scores.bleu_lc)
        self.log("val/chrf", scores.chrf)
        if self.global_rank == 0:
            log.info(
                "step %d: val BLEU %.2f on %d sentences (%s)",
                self.global_step,
                scores.bleu,
                scores.num_sentences,
                scores.bleu_signature,
            )

    # -- checkpoints -------------------------------------------------------------------------

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.count_bad_steps()  # an up-to-date count; a too long bad streak stops here, unwritten
        checkpoint["rng_states"] = get_rng_states()
        checkpoint["skipped_steps"] = self.skipped_steps
        dm = getattr(self.trainer, "datamodule", None)
        if dm is not None and getattr(dm, "src_tokenizer", None) is not None:
            # The SentencePiece models travel inside the checkpoint, so it can be evaluated on a
            # machine without the training run's data/ folder.
            checkpoint["tokenizers"] = {
                side: {"name": tok.model_path.name, "model": tok.to_bytes()}
                for side, tok in (("src", dm.src_tokenizer), ("tgt", dm.tgt_tokenizer))
            }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self._rng_to_restore = checkpoint.get("rng_states")
        self.skipped_steps = checkpoint.get("skipped_steps", 0)


def get_rng_states() -> dict[str, Any]:
    """The global random states, as tensors and plain values (loadable with weights_only)."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    states = {
        "torch": torch.get_rng_state(),
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached],
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state()  # this process's GPU (one per rank)
    return states


def set_rng_states(states: dict[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    kind, keys, pos, has_gauss, cached = states["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    random.setstate(states["python"])
    cuda = states.get("cuda")
    if cuda is not None and torch.cuda.is_available():
        if isinstance(cuda, list):  # checkpoints before 2026-11-22: every visible GPU's state,
            cuda = cuda[min(torch.cuda.current_device(), len(cuda) - 1)]  # maybe more than here
        torch.cuda.set_rng_state(cuda)
