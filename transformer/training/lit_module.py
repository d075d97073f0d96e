"""The Lightning module: teacher-forced training with label smoothing, validation loss and BLEU
(its hooks: :mod:`transformer.training.validation`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.strategies import FSDPStrategy
from lightning.pytorch.utilities import GradClipAlgorithmType
from torch import Tensor
from torch.optim.lr_scheduler import LambdaLR

from transformer.checkpoints import read_training_state, set_rng_states, write_training_state
from transformer.config import TransformerConfig
from transformer.data.datamodule import TranslationDataModule
from transformer.data.tokenizer import Tokenizer
from transformer.decoding.options import validation_decoding
from transformer.metrics import TOKENIZE, check_tokenize
from transformer.model import Transformer
from transformer.precision import AutocastWeights
from transformer.training.freeze import freeze as freeze_parts
from transformer.training.loggers import host_scalar, logs_after
from transformer.training.loss import LOSS_KERNELS, check_label_smoothing, label_smoothed_loss
from transformer.training.nonfinite import NonFiniteSteps
from transformer.training.optim import clip_gradients, configure_optimizers, gradient_norm
from transformer.training.rdrop import rdrop_loss
from transformer.training.step import CompiledLayers, compiled_hidden_states, hidden_states
from transformer.training.validation import Validation


class TranslationModule(Validation, L.LightningModule):
    """A :class:`Transformer` trained on :class:`transformer.data.collate.Batch` batches.

    Args:
        model: the :class:`TransformerConfig` fields, vocabulary sizes and pad id included.
        optimizer: partial optimizer taking parameter groups (Hydra ``_partial_: true``); its
            ``weight_decay`` applies to the decay group only.
        scheduler: partial taking the optimizer, returning a per-step LR scheduler; one that
            also takes ``progress`` (:class:`transformer.training.optim.BudgetLR`) gets
            :func:`transformer.training.budget.budget_progress` of the trainer.
        label_smoothing: epsilon of the label-smoothed cross entropy.
        rdrop_alpha: R-Drop's weight (0 = off): training runs each batch twice (one pass over the
            batch doubled, each copy with its own dropout) and adds ``rdrop_alpha`` times the
            passes' symmetric KL divergence (:func:`transformer.training.rdrop.rdrop_loss`);
            validation runs once.
        loss_kernel: the training steps' loss (:data:`transformer.training.loss.LOSS_KERNELS`):
            ``auto`` (the fastest measured; today ``chunked`` everywhere), ``chunked``,
            ``compiled`` or on CUDA ``liger`` (no NLL: ``train/ppl`` is not logged). Validation
            and R-Drop run the chunked loss.
        decoding: validation decoding, :class:`transformer.decoding.DecodeOptions` fields
            (``strategy``: ``greedy`` unless given, or ``beam``; ``beam_size``, ``len_penalty``,
            ``max_len_a``, ...); missing ones take its defaults, invalid ones raise ValueError.
        val_bleu_sentences: decode the first N validation sentences for BLEU (None: all; 0: none).
        bleu_tokenize: sacreBLEU's tokenizer for validation BLEU (``metrics.tokenize``; 13a,
            intl, zh, ja-mecab, char, ...: :func:`transformer.metrics.check_tokenize`).
        max_bad_steps: a step whose loss or gradient is NaN or inf is skipped (no update) and
            counted; this many in a row stop training with :class:`NonFiniteLoss`.
        compile_model: ``torch.compile`` the model's teacher-forced forward pass in training
            steps: ``True`` the whole of it (:func:`transformer.training.step.compile_options`),
            ``"layers"`` each layer on its own (:class:`transformer.training.step.CompiledLayers`).
            Validation, decoding and attention capture run the model as it is: the training
            graphs are never recompiled for them. The weights keep their names, so checkpoints
            load into an uncompiled model.
        compile_backend: ``torch.compile``'s backend: ``inductor`` generates kernels;
            ``aot_eager`` traces the same forward and backward graphs and runs them eagerly.
        shape_buckets: how many shapes training batches are padded to (``data.num_buckets``;
            :class:`transformer.data.collate.Buckets`); 0 = any shape.
        freeze: parts of the model kept fixed (``embeddings``, ``encoder``, ``decoder``,
            ``output``: :func:`transformer.training.freeze.freeze`), e.g. while fine-tuning.
    """

    def __init__(
        self,
        model: dict[str, Any],
        optimizer: Callable[..., torch.optim.Optimizer] | None = None,
        scheduler: Callable[..., Any] | None = None,
        label_smoothing: float = 0.1,
        rdrop_alpha: float = 0.0,
        loss_kernel: Literal["auto", "chunked", "compiled", "liger"] = "auto",
        decoding: dict[str, Any] | None = None,
        val_bleu_sentences: int | None = None,
        bleu_tokenize: str = TOKENIZE,
        max_bad_steps: int = 10,
        compile_model: bool | Literal["layers"] = False,
        compile_backend: str = "inductor",
        shape_buckets: int = 0,
        freeze: list[str] | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["optimizer", "scheduler"])
        self.cfg = TransformerConfig(**model)
        self.model = Transformer(self.cfg)
        freeze_parts(self.model, freeze or [])
        self.compile_model, self.compile_backend = compile_model, compile_backend
        self.shape_buckets = shape_buckets
        # Made at the first step, on the device (transformer.training.step.compiled_hidden_states)
        self._compiled: Callable[..., Tensor] | None = None
        self._layers: CompiledLayers | None = None  # compile=layers: made at the first step
        # Eager steps (and compile=layers ones) under autocast cast the linear weights in one go
        # (FSDP's own are left as they are: setup); compile=true leaves autocast's casts to the
        # compiler, which fuses them.
        self._autocast_weights: AutocastWeights | None = AutocastWeights(self.model)
        self.optimizer_factory, self.scheduler_factory = optimizer, scheduler
        self.label_smoothing = check_label_smoothing(label_smoothing)
        if rdrop_alpha < 0:
            raise ValueError(f"rdrop_alpha must be >= 0, got {rdrop_alpha}")
        self.rdrop_alpha = rdrop_alpha
        if loss_kernel not in LOSS_KERNELS:
            raise ValueError(f"loss_kernel must be one of {LOSS_KERNELS}, got {loss_kernel!r}")
        if rdrop_alpha > 0 and loss_kernel in ("compiled", "liger"):
            raise ValueError(f"R-Drop runs the chunked loss, not loss_kernel={loss_kernel!r}")
        self.loss_kernel = "chunked" if loss_kernel == "auto" else loss_kernel
        self.decoding = validation_decoding(decoding)
        self.val_bleu_sentences = val_bleu_sentences
        self.bleu_tokenize = check_tokenize(bleu_tokenize)
        self.nonfinite = NonFiniteSteps(max_bad_steps)
        self._last_batch_time: float | None = None
        self._rng_to_restore: dict[str, Any] | None = None
        self._val_sums: Tensor | None = None
        self._val_hyps: dict[int, str] = {}

    # -- training ----------------------------------------------------------------------------

    def forward(self, src: Tensor, tgt_in: Tensor, src_pad_mask: Tensor | None = None) -> Tensor:
        return self.model(src, tgt_in, src_pad_mask)

    def _compiled_layers(self) -> AbstractContextManager:
        """compile=layers: the layers compiled one by one for this step; else nothing."""
        if self.compile_model != "layers":
            return nullcontext()
        if self._layers is None:
            self._layers = CompiledLayers(self.model, self.compile_backend)
        return self._layers()

    def _compiled_step(self, device: torch.device) -> Callable[..., Tensor]:
        if self._compiled is None:
            backend, buckets = self.compile_backend, self.shape_buckets
            self._compiled = compiled_hidden_states(backend, buckets, device.type)
        return self._compiled

    def _loss(
        self, batch, rdrop: bool = False, compiled: bool = True
    ) -> tuple[Tensor, Tensor | None, Tensor]:
        """Loss sum, NLL sum and count over the N non-pad labels; the output projection runs on
        those positions only, in chunks fused with the loss (never (B, T, V) logits). ``rdrop``:
        R-Drop's loss of two passes, run as one over the batch doubled. ``compiled``: a training
        step's, with the compiled forward where ``compile_model`` asks for it and the loss of
        ``loss_kernel`` (the NLL None with ``liger``); else eager and chunked."""
        src, tgt_in, src_pad_mask = batch.src, batch.tgt_in, batch.src_pad_mask
        if rdrop:
            src, tgt_in, src_pad_mask = (torch.cat([t, t]) for t in (src, tgt_in, src_pad_mask))
        weights = {}
        if compiled and self.compile_model is True:
            forward = self._compiled_step(src.device)
            hidden = forward(self.model, src, tgt_in, src_pad_mask)  # (B or 2B, T, D)
        else:
            weights = self._autocast_weights() if self._autocast_weights is not None else {}
            layers = self._compiled_layers() if compiled else nullcontext()
            with layers:  # compile=layers: each layer's own graph
                hidden = hidden_states(self.model, src, tgt_in, src_pad_mask, weights)
        weight = weights.get("output.weight", self.model.output.weight)  # (V, D)
        bias = weights.get("output.bias", self.model.output.bias)  # (V,) or None (output_bias)
        eps, pad = self.label_smoothing, self.cfg.pad_id
        # The collator counted the non-pad labels on the host: a static size, no device sync.
        if rdrop:
            hidden = hidden.unflatten(0, (2, -1))  # (2, B, T, D)
            return rdrop_loss(
                hidden, weight, batch.labels, eps, self.rdrop_alpha, pad, batch.num_tgt_tokens,
                bias,
            )  # fmt: skip
        kernel = self.loss_kernel if compiled else "chunked"
        return label_smoothed_loss(
            hidden, weight, batch.labels, eps, pad, batch.num_tgt_tokens, kernel, bias
        )

    def setup(self, stage: str) -> None:
        if isinstance(self.trainer.strategy, FSDPStrategy):  # FSDP holds sharded parameters
            self._autocast_weights = None

    def on_fit_start(self) -> None:
        """Refuse validation pairs the model cannot take before the first step, not when the
        first validation reaches them (training keeps only pairs of ``data.max_len``)."""
        datamodule = self.trainer.datamodule
        if isinstance(datamodule, TranslationDataModule):
            datamodule.check_fits("val", self.cfg.max_positions)

    def on_train_batch_start(self, batch, batch_idx: int) -> None:
        if self._rng_to_restore is not None:  # first step after a resume: continue the streams
            set_rng_states(self._rng_to_restore)
            self._rng_to_restore = None

    def training_step(self, batch, batch_idx: int) -> Tensor:
        loss_sum, nll_sum, ntok = self._loss(batch, rdrop=self.rdrop_alpha > 0)
        ntok = ntok.clamp(min=1)
        loss = loss_sum / ntok
        # Nothing here waits for the device: a NaN/inf loss is only flagged, and every rank still
        # runs backward (DDP's all-reduce needs every rank); configure_gradient_clipping skips.
        self.nonfinite.flag(loss)
        now = time.perf_counter()
        bsz = len(batch.labels)
        # Not prog_bar: Lightning turns progress-bar values into numbers after every batch, a
        # device sync a step; the bar (TrainingProgressBar) reads the loss at logging steps.
        self.log("train/loss", loss, batch_size=bsz)
        if nll_sum is not None:  # (loss.kernel=liger gives none)
            self.log("train/ppl", (nll_sum.detach() / ntok).clamp(max=50.0).exp(), batch_size=bsz)
        lr = host_scalar(self.optimizers().param_groups[0]["lr"])
        self.log("lr", lr, prog_bar=True, batch_size=bsz)
        if self._last_batch_time is not None:
            tps = batch.num_tgt_tokens * self.trainer.world_size / (now - self._last_batch_time)
            self.log("train/tokens_per_sec", host_scalar(tps), prog_bar=True, batch_size=bsz)
        self._last_batch_time = now
        return loss

    def configure_gradient_clipping(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        """After backward, before ``optimizer.step()`` (Lightning calls it whether or not clipping
        is on): clip, and skip the update of a step whose loss or gradients are NaN or inf.

        Clipping: ``trainer.gradient_clip_val`` for every precision, optimizer and strategy
        (Lightning's own refuses fused AdamW under mixed precision: :func:`clip_gradients`); the
        norm before clipping is logged as ``train/grad_norm`` (a device tensor: no sync here).
        The same norm (or, without clipping, the gradients' norm) flags a step whose gradients
        are not finite though its loss is; under fp16 the GradScaler skips those itself."""
        trainer = self.trainer
        fp16 = trainer.precision == "16-mixed"
        norm = None
        if gradient_clip_val:
            algorithm = GradClipAlgorithmType(gradient_clip_algorithm or "norm")
            norm = clip_gradients(trainer, optimizer, float(gradient_clip_val), algorithm)
            self.log("train/grad_norm", norm)
        if not fp16:
            self.nonfinite.flag(gradient_norm(optimizer) if norm is None else norm)
        step = self.global_step
        self.nonfinite.skip_if_bad(
            optimizer, step, world_size=trainer.world_size, fp16=fp16,
            log_step=logs_after(step, trainer.log_every_n_steps),
        )  # fmt: skip
        self.log("train/skipped_steps", host_scalar(self.nonfinite.skipped))

    def on_train_epoch_start(self) -> None:
        self._last_batch_time = None
        # Lightning calls ``set_epoch`` on ``dataloader.sampler`` and ``batch_sampler.sampler``
        # only, not on a batch sampler itself; tell a batch sampler here too, before the epoch's
        # first batch is drawn (same epoch = keep the position, as after a resume).
        sampler = getattr(self.trainer.train_dataloader, "batch_sampler", None)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(self.current_epoch)

    def lr_scheduler_step(self, scheduler, metric: Any = None) -> None:
        """Advance a schedule by the updates made, not the steps taken: a step skipped for a NaN
        or inf loss or gradient leaves the learning rate where it was, and a resumed run
        continues the same schedule. Exact where the skips are counted every step; with fused
        AdamW (counted lazily) the schedule runs ahead by the skips not yet counted and falls back
        at the next count (a logging step, a checkpoint). A schedule other than a ``LambdaLR``
        (closed form in its step) counts steps taken."""
        if isinstance(scheduler, LambdaLR):
            scheduler.last_epoch = self.global_step - self.nonfinite.skipped - 1  # step() adds 1
        scheduler.step()

    def configure_optimizers(self):
        if self.optimizer_factory is None:
            raise ValueError("TranslationModule needs an optimizer to train")
        return configure_optimizers(
            self.model, self.optimizer_factory, self.scheduler_factory, self.trainer
        )

    # -- checkpoints -------------------------------------------------------------------------

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.nonfinite.count()  # an up-to-date count; a too long bad streak stops here, unwritten
        write_training_state(checkpoint, self.nonfinite.skipped, self._tokenizers())

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self._rng_to_restore, self.nonfinite.skipped = read_training_state(
            checkpoint, self.global_rank
        )

    def _tokenizers(self) -> tuple[Tokenizer, Tokenizer] | None:
        """The data's (source, target) tokenizers, once it has them."""
        dm = self.trainer.datamodule
        if not isinstance(dm, TranslationDataModule) or dm.src_tokenizer is None:
            return None
        return dm.src_tokenizer, dm.tgt_tokenizer
