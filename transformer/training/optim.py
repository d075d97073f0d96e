"""Optimizer parameter groups, gradient clipping and the learning-rate schedule.

Weight decay applies to weight matrices only (``p.dim() >= 2``), never to biases, LayerNorm
parameters or embeddings (a tied output projection is the target embedding, so it is not decayed
either), learned position tables and relative-bias tables included. The default schedule is the
Transformer's: linear warmup to the peak learning rate, then decay with the inverse square root of
the step. The budgeted schedules (:class:`BudgetLR`: linear, cosine, warmup-stable-decay) warm up
the same way and reach their minimum when training ends, at ``trainer.max_steps`` or
``trainer.max_time``.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.utilities import GradClipAlgorithmType
from torch import Tensor, nn
from torch.distributed.fsdp import FullyShardedDataParallel
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

from transformer.training.budget import budget_progress, warn_if_epochs_end_first
from transformer.training.muon import MuonAdamW, muon_groups


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Two AdamW groups: matrices with ``weight_decay``, everything else with none. Tables that
    are looked up rather than multiplied are not decayed: an ``nn.Embedding``'s, and the own
    parameters of a module whose class says ``no_weight_decay = True`` (learned positions,
    relative biases)."""
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    embeddings |= {
        id(p)
        for m in model.modules()
        if getattr(m, "no_weight_decay", False)
        for p in m.parameters(recurse=False)
    }
    decay, no_decay = [], []
    for p in model.parameters():  # shared (tied) parameters come once
        if not p.requires_grad:
            continue
        (decay if p.dim() >= 2 and id(p) not in embeddings else no_decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def build_optimizer(
    model: nn.Module,
    optimizer: Callable[..., Optimizer],
    weight_decay: float,
    *,
    sharded_fp16: bool = False,
) -> Optimizer:
    """``optimizer`` is a partial (from Hydra's ``_partial_: true``) taking parameter groups.

    ``fused=None`` (the config's ``null``, or no ``fused`` at all) means the fused kernel when
    the parameters live on a CUDA GPU, torch's default (foreach) elsewhere; ``True`` or ``False``
    is passed on as it is.

    ``sharded_fp16``: the run scales fp16 losses with FSDP's ``ShardedGradScaler``. Its
    ``found_inf`` has shape (1,), which torch's fused Adam kernels cannot subtract from their
    scalar step counts ("output with shape [] doesn't match the broadcast shape [1]", measured
    on an H200 with torch 2.11). Here ``fused=None`` means foreach, and ``fused=True`` is refused.
    """
    kwargs: dict[str, Any] = {}
    target = getattr(optimizer, "func", optimizer)
    fused = getattr(optimizer, "keywords", {}).get("fused")
    if fused and sharded_fp16:
        raise ValueError(
            "optim.optimizer.fused=true does not work with trainer=fsdp and "
            "trainer.precision=16-mixed: torch's fused AdamW cannot take the flag of FSDP's "
            "ShardedGradScaler. Set optim.optimizer.fused=null (foreach there), or use "
            "trainer.precision=bf16-mixed, which needs no scaler."
        )
    on_cuda = all(p.is_cuda for p in model.parameters())
    if fused is None and on_cuda and not sharded_fp16:
        if "fused" in inspect.signature(target).parameters:
            kwargs["fused"] = True
    groups = param_groups(model, weight_decay)
    if isinstance(target, type) and issubclass(target, MuonAdamW):
        groups = muon_groups(groups)
    return optimizer(groups, **kwargs)


def gradient_norm(optimizer: Optimizer) -> Tensor:
    """The total 2-norm of ``optimizer``'s gradients (this process's shards under FSDP), on the
    device: NaN or inf where any gradient is."""
    grads = [
        p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None
    ]
    return torch.nn.utils.get_total_norm(grads)


def clip_gradients(
    trainer: L.Trainer, optimizer: Optimizer, clip_val: float, algorithm: GradClipAlgorithmType
) -> Tensor:
    """Clip the gradients of ``optimizer``'s parameters for any precision, optimizer and strategy
    a run can choose; return their total norm before clipping.

    Lightning (2.6) clips through its precision plugin, which refuses an optimizer that unscales
    gradients itself (fused AdamW, the default on CUDA) under mixed precision, bf16 included where
    nothing is scaled, and FSDP's plugin refuses the norm. Here instead:

    * fp16 with a GradScaler and a fused optimizer: the gradients are unscaled first, so the norm
      is the true one; ``GradScaler.step`` then hands the kernel its ``found_inf`` and no scale.
      (Lightning has already unscaled them for any other optimizer.)
    * FSDP: the sharded root module's ``clip_grad_norm_``, the norm over all shards.
    * otherwise ``torch.nn.utils.clip_grad_norm_``.

    Nothing waits for the device: the norm stays a tensor. A NaN/inf norm leaves NaN gradients in
    a step that is skipped anyway (the norm is flagged, or the scaler found inf).
    """
    scaler = getattr(trainer.precision_plugin, "scaler", None)
    if scaler is not None and getattr(optimizer, "_step_supports_amp_scaling", False):
        scaler.unscale_(optimizer)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if algorithm == GradClipAlgorithmType.VALUE:
        norm = gradient_norm(optimizer)  # before clamping turns an inf into a finite value
        torch.nn.utils.clip_grad_value_(params, clip_val)
        return norm
    model = trainer.strategy.model
    if isinstance(model, FullyShardedDataParallel):
        return model.clip_grad_norm_(clip_val)
    return torch.nn.utils.clip_grad_norm_(params, clip_val)


def inverse_sqrt_factor(step: int, warmup_steps: int) -> float:
    """Multiplier of the peak learning rate after ``step`` optimizer steps.

    Linear warmup ``(step + 1) / warmup_steps`` up to 1 at ``step + 1 == warmup_steps``, then
    ``sqrt(warmup_steps / (step + 1))``; with ``warmup_steps == 0`` only the decay, from step 1.
    """
    s = step + 1
    if warmup_steps <= 0:
        return 1.0 / math.sqrt(s)
    return min(s / warmup_steps, math.sqrt(warmup_steps / s))


def warmup_inverse_sqrt(optimizer: Optimizer, warmup_steps: int = 4000) -> LambdaLR:
    """The schedule as a LambdaLR, to be stepped once per optimizer step."""
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
    return LambdaLR(optimizer, lambda step: inverse_sqrt_factor(step, warmup_steps))


Shape = Literal["linear", "cosine", "wsd"]
SHAPES = ("linear", "cosine", "wsd")


def budget_factor(
    updates: int,
    progress: float,
    shape: Shape,
    warmup_steps: int,
    min_lr_ratio: float = 0.0,
    cooldown: float = 0.2,
) -> float:
    """Multiplier of the peak learning rate for the ``updates``-th update (counted from 1), made
    when ``progress`` (0 to 1) of the training budget is used.

    The decay ``d`` falls from 1 at progress 0 to 0 at progress 1: ``1 - p`` (linear),
    ``(1 + cos(pi p)) / 2`` (cosine), or 1 until the last ``cooldown`` share of the budget and
    then linearly to 0 (``wsd``, warmup-stable-decay). The factor is
    ``min(updates / warmup_steps, min_lr_ratio + (1 - min_lr_ratio) d)``: the warmup ramp rises
    until it meets the decay curve (under cosine and linear a little below the peak, at
    ``d(warmup share)``), and at progress 1 the factor is ``min_lr_ratio``.
    """
    p = min(max(progress, 0.0), 1.0)
    if shape == "linear":
        decay = 1.0 - p
    elif shape == "cosine":
        decay = 0.5 * (1.0 + math.cos(math.pi * p))
    else:
        decay = min(1.0, (1.0 - p) / cooldown)
    warm = updates / warmup_steps if warmup_steps > 0 else 1.0
    return min(warm, min_lr_ratio + (1.0 - min_lr_ratio) * decay)


class BudgetLR(LambdaLR):
    """A schedule that ends with training: :func:`budget_factor` of the update count (the
    scheduler's step, as for :func:`warmup_inverse_sqrt`) and of ``progress()``, the share of
    the training budget used once the next update is made (the Lightning module supplies it
    from ``trainer.max_steps`` and ``trainer.max_time``:
    :func:`transformer.training.budget.budget_progress`).
    ``progress`` is not part of the state dict: a resumed run gets it from its trainer.
    """

    def __init__(
        self,
        optimizer: Optimizer,
        progress: Callable[[], float],
        shape: Shape = "cosine",
        warmup_steps: int = 1000,
        min_lr_ratio: float = 0.0,
        cooldown: float = 0.2,
    ) -> None:
        if shape not in SHAPES:
            raise ValueError(f"shape={shape!r}; choose one of {', '.join(SHAPES)}")
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
        if not 0.0 <= min_lr_ratio < 1.0:
            raise ValueError(f"min_lr_ratio must be in [0, 1), got {min_lr_ratio}")
        if not 0.0 < cooldown <= 1.0:
            raise ValueError(f"cooldown must be in (0, 1], got {cooldown}")
        self.progress = progress
        super().__init__(
            optimizer,
            lambda step: budget_factor(
                step + 1, self.progress(), shape, warmup_steps, min_lr_ratio, cooldown
            ),
        )

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        del state["progress"]  # a function of the trainer, not state
        return state


def takes_progress(scheduler: Callable[..., Any]) -> bool:
    """Whether a scheduler factory (a partial) follows the training budget: it takes
    ``progress`` (:class:`BudgetLR`)."""
    target = getattr(scheduler, "func", scheduler)
    return "progress" in inspect.signature(target).parameters


def configure_optimizers(
    model: nn.Module,
    optimizer: Callable[..., Optimizer],
    scheduler: Callable[..., Any] | None,
    trainer: L.Trainer,
) -> Optimizer | dict[str, Any]:
    """What a LightningModule's ``configure_optimizers`` returns: ``optimizer`` built on
    ``model`` (:func:`build_optimizer`, its ``weight_decay`` for the decay group) and, with a
    ``scheduler``, the schedule stepped every optimizer step; a budgeted one (it takes
    ``progress``, :func:`takes_progress`) follows
    :func:`transformer.training.budget.budget_progress` of ``trainer``."""
    wd = getattr(optimizer, "keywords", {}).get("weight_decay", 0.0)
    scaler = getattr(trainer.precision_plugin, "scaler", None)
    opt = build_optimizer(model, optimizer, wd, sharded_fp16=isinstance(scaler, ShardedGradScaler))
    if scheduler is None:
        return opt
    if takes_progress(scheduler):  # a budgeted schedule: ends with training
        schedule = scheduler(opt, progress=budget_progress(trainer))
        warn_if_epochs_end_first(trainer)
    else:
        schedule = scheduler(opt)
    return {
        "optimizer": opt,
        "lr_scheduler": {"scheduler": schedule, "interval": "step", "frequency": 1},
    }


__all__ = [
    "SHAPES",
    "BudgetLR",
    "budget_factor",
    "build_optimizer",
    "clip_gradients",
    "configure_optimizers",
    "inverse_sqrt_factor",
    "param_groups",
    "takes_progress",
    "warmup_inverse_sqrt",
]
