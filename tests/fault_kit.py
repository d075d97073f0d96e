"""A callback that slows training down, so a test can interrupt a ``train.py`` subprocess at a
chosen step (``+callbacks.slow._target_=fault_kit.SlowSteps``, with ``tests/`` on PYTHONPATH)."""

from __future__ import annotations

import time

from lightning.pytorch.callbacks import Callback


class SlowSteps(Callback):
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        time.sleep(self.seconds)
