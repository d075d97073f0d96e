"""Callbacks that slow training down, so a test can interrupt a ``train.py`` subprocess at a
chosen point (``+callbacks.slow._target_=tests.fault_kit.SlowSteps``, with the repository on
PYTHONPATH), record what it trained on (``tests.fault_kit.BatchIdRecorder``), or run Lightning's
``Timer`` on a fake clock (``tests.fault_kit.FakeClock``)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import lightning.pytorch.callbacks.timer
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
        from transformer.training import lit_module

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


class BatchIdRecorder(Callback):
    """Writes the example ids of every training batch, per rank, to
    ``<out_dir>/batch_ids.rank<R>.jsonl`` (one line per batch): checks of DDP sharding and of
    resume order."""

    def __init__(self, out_dir: str | os.PathLike) -> None:
        self.out_dir = Path(out_dir)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        path = self.out_dir / f"batch_ids.rank{trainer.global_rank}.jsonl"
        with open(path, "a") as f:
            f.write(json.dumps({"step": trainer.global_step, "ids": batch.ids.tolist()}) + "\n")


class FakeClock(Callback):
    """Lightning's ``Timer`` (``trainer.max_time``) reads this clock instead of the real one; it
    moves ``seconds`` at the start of every training batch and never otherwise, so training
    time is exactly ``seconds`` per step, validation taking none."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.now = seconds, 1000.0
        self._real = lightning.pytorch.callbacks.timer.time

    def monotonic(self) -> float:
        return self.now

    def setup(self, trainer, pl_module, stage: str) -> None:
        lightning.pytorch.callbacks.timer.time = self

    def teardown(self, trainer, pl_module, stage: str) -> None:
        lightning.pytorch.callbacks.timer.time = self._real

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.now += self.seconds
