"""Training callbacks, and the Trainer's checkpoint writer (:class:`AtomicCheckpointIO`)."""

from __future__ import annotations

import logging
import os
import signal
import threading
from itertools import chain
from pathlib import Path
from types import FrameType
from typing import Any

import lightning as L
import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.callbacks import (
    Checkpoint,
    TQDMProgressBar,
    WeightAveraging,
)
from torch import Tensor
from torch.optim.swa_utils import get_ema_multi_avg_fn

from transformer.atomic import atomic_save
from transformer.errors import CheckpointError, Interrupted
from transformer.training.lit_module import TranslationModule
from transformer.training.loggers import logs_after
from transformer.training.nonfinite import NonFiniteSteps

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class LastCheckpoint(Checkpoint):
    """Keeps ``<dirpath>/last.ckpt``: every ``every_n_train_steps`` optimizer steps and at the end
    of training, always in the state between two training steps (what exact resume needs).

    Lightning's ``ModelCheckpoint(save_last=True)`` writes ``last.ckpt`` after validation but not
    when training stops later (e.g. at ``max_steps`` mid-epoch), hence this callback.

    Training that stops inside an epoch (``max_steps``, ``trainer.max_time``, anything that sets
    ``trainer.should_stop`` after a batch) is saved at that batch's end, not at ``on_train_end``,
    where Lightning already counts the cut epoch complete and a resumed run would start the next
    one. Being a :class:`Checkpoint`, Lightning runs it after the other callbacks (the ``Timer``
    that ``max_time`` installs among them), so it sees their stop.

    SIGTERM or SIGINT (Ctrl-C) during training finishes the current optimizer step, writes
    ``last.ckpt`` and stops with :class:`Interrupted`; a second Ctrl-C stops at once.

    A :class:`TranslationModule`'s NaN/inf steps (its ``nonfinite``) are counted before each
    write, and none is written while the last steps were skipped: the last good one is kept.
    """

    def __init__(self, dirpath: str | os.PathLike, every_n_train_steps: int | None = 1000) -> None:
        self.dirpath = Path(dirpath)
        self.every_n_train_steps = every_n_train_steps
        self._saved_step = -1
        self._step_at_batch_start = -1
        self._stop_signal: int | None = None
        self._previous_handlers: dict[int, object] = {}
        self.nonfinite: NonFiniteSteps | None = None

    @property
    def path(self) -> Path:
        return self.dirpath / "last.ckpt"

    def _save(self, trainer: L.Trainer) -> None:
        if (
            trainer.fast_dev_run
            or trainer.sanity_checking
            or trainer.global_step == self._saved_step
            or (self.nonfinite is not None and self.nonfinite.count())  # keep the last good one
        ):
            return
        trainer.save_checkpoint(self.path, weights_only=False)  # all a resume needs
        self._saved_step = trainer.global_step

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if isinstance(pl_module, TranslationModule):
            self.nonfinite = pl_module.nonfinite

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._saved_step = trainer.global_step  # a resumed run need not rewrite its checkpoint
        # SIGTERM during the sanity check went to Lightning, which would exit 0 after a step
        self._stop_signal = signal.SIGTERM if trainer.received_sigterm else None
        if threading.current_thread() is threading.main_thread():  # (Lightning's SIGTERM
            for sig in STOP_SIGNALS:  # handler, installed just before, is put back at the end)
                self._previous_handlers[sig] = signal.signal(sig, self._request_stop)

    def _request_stop(self, signum: int, frame: FrameType | None) -> None:
        if self._stop_signal == signal.SIGINT and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: do not wait
        self._stop_signal = signum
        log.warning(
            "%s received: stopping after this step, once %s is written",
            signal.Signals(signum).name,
            self.path,
        )

    def _restore_handlers(self) -> None:
        for sig, handler in self._previous_handlers.items():
            signal.signal(sig, handler)
        self._previous_handlers = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._step_at_batch_start = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        n, step = self.every_n_train_steps, trainer.global_step
        last_step = 0 < trainer.max_steps <= step or trainer.should_stop
        if step > 0 and ((n and step % n == 0) or last_step):
            self._save(trainer)
        if self._stop_signal is not None and step != self._step_at_batch_start:  # step boundary
            self._save(trainer)
            name = signal.Signals(self._stop_signal).name
            raise Interrupted(
                f"{name} at step {step}: training stopped; {self.path} holds step "
                f"{self._saved_step}, resume with ckpt_path={self.path}",
                self._stop_signal,
            )

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._restore_handlers()
        self._save(trainer)

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        self._restore_handlers()


class WeightEMA(WeightAveraging):
    """An exponential moving average of the weights (``ema.decay``) on Lightning's weight
    averaging: updated after every optimizer step (the first update copies the weights, then
    ``average = decay * average + (1 - decay) * weights``); validation runs on the average; a
    full checkpoint holds it as its ``state_dict`` (what evaluation loads) and the trained weights
    as ``current_model_state``, and resuming restores both. Weights-only checkpoints (the epoch
    checkpoints) hold the trained weights.

    Three changes from Lightning's ``EMAWeightAveraging``: the update is one foreach operation
    over all weights (torch's ``get_ema_multi_avg_fn``) instead of three operations per tensor;
    it does not wait for the device (``AveragedModel.update_parameters`` reads its update count,
    a device tensor, twice a step: here the count is read once a fit and kept on the host); and
    Lightning copies the average into the model when training ends, before
    :class:`LastCheckpoint` writes its final checkpoint, which would then resume from the average
    instead of the trained weights; here the model keeps them.
    """

    def __init__(self, decay: float) -> None:
        self._ema = get_ema_multi_avg_fn(decay)
        super().__init__(multi_avg_fn=self._ema)
        self._updates: int | None = None  # the average's update count, on the host

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        self._updates = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step <= self._latest_update_step:
            return
        average = self._average_model
        if self._updates is None:  # once a fit, after a resumed run's average is loaded
            self._updates = int(average.n_averaged)
        groups: dict[tuple, tuple[list[Tensor], list[Tensor]]] = {}
        pairs = zip(
            chain(average.module.parameters(), average.module.buffers()),
            chain(pl_module.parameters(), pl_module.buffers()),
            strict=True,
        )
        for mine, theirs in pairs:  # by dtype: the foreach update takes one at a time
            group = groups.setdefault((mine.device, mine.dtype), ([], []))
            group[0].append(mine.detach())
            group[1].append(theirs.detach())
        for mine, theirs in groups.values():
            if self._updates == 0:
                torch._foreach_copy_(mine, theirs)
            else:
                self._ema(mine, theirs, average.n_averaged)
        average.n_averaged += 1
        self._updates += 1
        self._latest_update_step = trainer.global_step

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        pass


class TrainingProgressBar(TQDMProgressBar):
    """Lightning's TQDM bar, with ``train/loss`` as last logged.

    Lightning turns every value logged with ``prog_bar=True`` into a number after every batch,
    whatever the bar's refresh rate: for the loss, a device tensor, that is a device sync a step,
    the GPU idle while the host waits. So the training module logs its loss without
    ``prog_bar``, and this bar reads the step's loss only after the first step and at logging
    steps (every ``trainer.log_every_n_steps``), where the loggers read it anyway.
    """

    def __init__(self, refresh_rate: int = 1, process_position: int = 0, leave: bool = False):
        super().__init__(refresh_rate, process_position, leave)
        self._loss: float | None = None
        self._loss_step = -1

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step  # optimizer steps made, this batch's included
        if step != self._loss_step and (
            step == 1 or logs_after(step - 1, trainer.log_every_n_steps)
        ):
            loss = outputs.get("loss") if isinstance(outputs, dict) else None
            if loss is not None:
                self._loss, self._loss_step = float(loss), step
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        items = super().get_metrics(trainer, pl_module)
        if self._loss is not None:
            items["train/loss"] = self._loss
        return items


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint writer with :func:`atomic_save`: every checkpoint the Trainer
    writes (``last.ckpt``, the best checkpoint) is either the old file or the complete new one;
    a failed write (a full disk) is a :class:`CheckpointError` naming the file."""

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | os.PathLike, storage_options: Any = None
    ) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options")
        try:
            atomic_save(checkpoint, path)
        except OSError as err:  # a full disk, a quota, a directory removed
            raise CheckpointError(
                f"could not write checkpoint {path} ({err.strerror or err}); nothing half-written "
                "is left, an earlier one there is whole; free space there, or write elsewhere "
                "(hydra.run.dir=DIR)"
            ) from err
