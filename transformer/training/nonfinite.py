"""Steps whose loss or gradients are NaN or inf: flagged on the device, skipped, counted on the host
lazily."""

from __future__ import annotations

import logging

import torch
from torch import Tensor

from transformer.errors import NonFiniteLoss

log = logging.getLogger(__name__)


class NonFiniteSteps:
    """The training module's NaN/inf bookkeeping;
    :class:`transformer.training.callbacks.LastCheckpoint` reads it too, so that no checkpoint is
    written from inside a bad streak.

    A flag per optimizer step stays on the device until :meth:`count` reads the pending ones
    (one sync): at logging steps, before every checkpoint, and every step where the optimizer
    cannot skip on the device. ``max_in_a_row`` bad steps in a row raise :class:`NonFiniteLoss`.
    """

    def __init__(self, max_in_a_row: int) -> None:
        self.max_in_a_row = max_in_a_row
        self.skipped = 0  # steps skipped for a NaN or inf loss or gradient, in the whole run
        self.in_a_row = 0  # both as counted so far
        self._bad: Tensor | None = None  # this step's loss or gradient was NaN/inf (device bool)
        self._uncounted: list[tuple[int, Tensor]] = []  # (step, bad) not yet read on the host

    def flag(self, value: Tensor) -> None:
        """Note a micro-batch's loss or the step's gradient norm, without waiting for the
        device: a NaN/inf in any of them (any micro-batch of an accumulated step) makes the step
        bad."""
        bad = ~torch.isfinite(value)
        self._bad = bad if self._bad is None else self._bad | bad

    def skip_if_bad(
        self,
        optimizer: torch.optim.Optimizer,
        step: int,
        *,
        world_size: int,
        fp16: bool,
        log_step: bool,
    ) -> None:
        """Before ``optimizer.step()``: make it change nothing if this step's loss or gradients
        were NaN or inf on any rank.

        A fused optimizer (AdamW ``fused=True``, the default on CUDA) skips on the device: its
        kernel reads ``found_inf``, the flag GradScaler uses, and the flags are read on the host
        only at logging steps (``log_step``) and checkpoints. Any other optimizer needs the
        decision on the host, one sync per step, to drop the gradients; fp16's GradScaler skips
        by itself.
        """
        bad, self._bad = self._bad, None
        if world_size > 1:  # a NaN on one rank skips the step on all of them
            bad = bad.int()
            torch.distributed.all_reduce(bad, op=torch.distributed.ReduceOp.MAX)
            bad = bad.bool()
        self._uncounted.append((step, bad))
        on_device = getattr(optimizer, "_step_supports_amp_scaling", False)  # reads found_inf
        if not (fp16 or on_device) or log_step:
            self.count()
        if fp16:
            return
        if on_device:
            optimizer.found_inf = bad.float()  # 1: the fused kernel changes nothing
        elif self.in_a_row:
            optimizer.zero_grad(set_to_none=True)  # no gradients: the optimizer changes nothing

    def count(self) -> int:
        """Read the pending flags on the host (one sync), update ``skipped`` and ``in_a_row`` and
        return the latter; raise :class:`NonFiniteLoss` once ``max_in_a_row`` in a row were
        skipped."""
        if not self._uncounted:
            return self.in_a_row
        steps, flags = zip(*self._uncounted, strict=True)
        self._uncounted = []
        for step, bad in zip(steps, torch.stack(flags).tolist(), strict=True):
            if not bad:
                self.in_a_row = 0
                continue
            self.skipped += 1
            self.in_a_row += 1
            log.warning(
                "step %d: loss or gradients NaN or inf, step skipped (%d in a row, %d in all)",
                step, self.in_a_row, self.skipped,
            )  # fmt: skip
            if self.in_a_row >= self.max_in_a_row:
                raise NonFiniteLoss(
                    f"the loss or gradients were NaN or inf for {self.in_a_row} steps in a row, "
                    f"the last at step {step}; training stopped. No checkpoint was written since "
                    "the last good step; lower optim.optimizer.lr, or raise loss.max_bad_steps"
                )
        return self.in_a_row
