"""Callbacks that slow training down, so a test can interrupt a ``train.py`` subprocess at a
chosen point (``+callbacks.slow._target_=fault_kit.SlowSteps``, with ``tests/`` on PYTHONPATH)."""

from __future__ import annotations

import time
from pathlib import Path

import torch
from lightning.pytorch.callbacks import Callback


class SlowSteps(Callback):
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        time.sleep(self.seconds)


class PauseInSanityCheck(Callback):
    """Creates ``marker``, then sleeps, when the sanity check starts (before training does)."""

    def __init__(self, seconds: float, marker: str) -> None:
        self.seconds, self.marker = seconds, Path(marker)

    def on_sanity_check_start(self, trainer, pl_module) -> None:
        self.marker.touch()
        time.sleep(self.seconds)


class PoisonLoss(Callback):
    """Makes the training loss NaN for the given batches (counted from 0) on one rank only."""

    def __init__(self, rank: int, batches: list[int]) -> None:
        self.rank, self.batches = rank, set(batches)

    def setup(self, trainer, pl_module, stage: str) -> None:
        if trainer.global_rank != self.rank:
            return
        from transformer import lit_module

        real, seen = lit_module.label_smoothed_loss, [0]

        def loss(*args, **kwargs):
            out = real(*args, **kwargs)
            if torch.is_grad_enabled():  # training, not validation
                seen[0] += 1
                if seen[0] - 1 in self.batches:
                    return out[0] * float("nan"), out[1], out[2]
            return out

        lit_module.label_smoothed_loss = loss


class StopAtStep(Callback):
    """Sets ``trainer.should_stop`` after optimizer step ``step``, as Lightning's ``Timer`` does
    when ``trainer.max_time`` runs out: training stops inside the epoch."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step >= self.step:
            trainer.should_stop = True
