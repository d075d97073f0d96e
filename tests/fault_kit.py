"""Callbacks that slow training down, so a test can interrupt a ``train.py`` subprocess at a
chosen point (``+callbacks.slow._target_=fault_kit.SlowSteps``, with ``tests/`` on PYTHONPATH)."""

from __future__ import annotations

import time
from pathlib import Path

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
