"""The epoch checkpoints a run's evaluation averages: the weights at the end of each complete
training epoch, or of those in the last share of the training budget."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint

from transformer.errors import ConfigError
from transformer.training.budget import budget_progress, budget_timer


class EpochCheckpoint(ModelCheckpoint):
    """A :class:`ModelCheckpoint` that saves at the end of complete training epochs only.

    Lightning ends the epoch loop, and calls ``on_train_epoch_end``, also when training stops
    inside an epoch (``trainer.max_steps``, ``trainer.max_time``); ``ModelCheckpoint`` would then
    save that partial epoch too, a few steps after the previous epoch's checkpoint, and an average
    of the last N epochs would weight nearly the same weights twice. Here an epoch counts when it
    ran to its last batch (with gradient accumulation the last batch always ends in an optimizer
    step). A run shorter than one epoch thus keeps no epoch checkpoint (``last.ckpt`` is written
    anyway, by :class:`LastCheckpoint`). Saving always happens at the train epoch's end
    (``save_on_train_epoch_end=True``), never after a validation inside the epoch.

    ``budget_share``: save only the epochs that end in the last share of the training budget
    (``trainer.max_steps`` or ``trainer.max_time``, as the schedules that end with it measure it:
    :func:`transformer.training.budget.budget_progress`), e.g. 0.2, a warmup-stable-decay
    schedule's decay phase at its ``cooldown`` of 0.2; with ``save_top_k=-1`` all of those, so
    that an average of the epoch checkpoints covers the same share of training whether the budget
    holds 25 epochs or 60. None: every complete epoch (``save_top_k`` the most recent kept).
    """

    def __init__(
        self,
        *args: Any,
        save_on_train_epoch_end: bool | None = True,
        budget_share: float | None = None,
        **kwargs: Any,
    ):
        if save_on_train_epoch_end is False:
            raise ValueError(
                "EpochCheckpoint saves at the end of training epochs: save_on_train_epoch_end "
                "must be true"
            )
        check_budget_share(budget_share, has_budget=True)
        super().__init__(*args, save_on_train_epoch_end=True, **kwargs)
        self.budget_share = budget_share
        self._progress: Callable[[], float] | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        if self.budget_share is None or stage != "fit":
            return
        has_budget = trainer.max_steps > 0 or budget_timer(trainer) is not None
        check_budget_share(self.budget_share, has_budget)
        self._progress = budget_progress(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if epoch_ran_to_its_end(trainer) and self._in_window():
            super().on_train_epoch_end(trainer, pl_module)

    def _in_window(self) -> bool:
        """Whether the epoch now ending lies in the kept last share of the budget."""
        if self._progress is None:
            return True
        return self._progress() >= 1.0 - self.budget_share  # type: ignore[operator]


def epoch_ran_to_its_end(trainer: L.Trainer) -> bool:
    """Whether the training epoch now ending ran to its last batch (at ``on_train_epoch_end``),
    rather than being cut short by ``max_steps``, ``max_time`` or ``trainer.should_stop``.

    The test Lightning (2.6) itself uses before stepping epoch-interval LR schedulers
    (``_TrainingEpochLoop._num_ready_batches_reached``), from the loop's public progress counters:
    the batches fetched this epoch (counted on across a mid-epoch resume) reached the loader's
    length, or the data fetcher found no next batch. Decided on rank 0 for all ranks, so that
    every rank saves, or none.
    """
    progress = trainer.fit_loop.epoch_loop.batch_progress
    ended = progress.is_last_batch or progress.current.ready == trainer.num_training_batches
    return bool(trainer.strategy.broadcast(ended))


def check_budget_share(share: float | None, has_budget: bool) -> None:
    """``budget_share`` is null, or a share in (0, 1] of a budget the run has
    (``trainer.max_steps`` or ``trainer.max_time``); else a ConfigError naming the option."""
    if share is None:
        return
    option = f"callbacks.epoch_checkpoints.budget_share={share!r}"
    if isinstance(share, bool) or not isinstance(share, int | float) or not 0.0 < share <= 1.0:
        raise ConfigError(
            f"{option}: give the share of the training budget whose epochs are kept, in (0, 1], "
            "or null for every epoch"
        )
    if not has_budget:
        raise ConfigError(
            f"{option} keeps the epochs of the last share of the training budget, and this run "
            "has none: set trainer.max_steps or trainer.max_time, or budget_share=null"
        )
