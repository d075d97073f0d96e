"""The training budget, ``trainer.max_steps`` and ``trainer.max_time``: how much of it a run has
used, for the learning-rate schedules that end with it
(:class:`transformer.training.optim.BudgetLR`), and a warning where an epoch limit ends training
before it."""

from __future__ import annotations

import logging
from collections.abc import Callable

import lightning as L
from lightning.pytorch.callbacks import Timer

log = logging.getLogger(__name__)


def budget_progress(trainer: L.Trainer) -> Callable[[], float]:
    """The share of the training budget used once the next optimizer step is made: the larger of
    ``(global_step + 1) / trainer.max_steps`` and the training time elapsed over
    ``trainer.max_time``, so whichever limit ends training first. The time is Lightning's
    ``Timer`` (the one ``max_time`` installs): measured from the start of fit, validation
    included, and saved in checkpoints, so a resumed run continues from the time already spent.
    Under DDP rank 0's time is broadcast, for the same rate on every rank."""
    timer = budget_timer(trainer)

    def progress() -> float:
        share = (trainer.global_step + 1) / trainer.max_steps if trainer.max_steps > 0 else 0.0
        if timer is not None:
            elapsed = timer.time_elapsed("train")
            share_of_time = elapsed / (elapsed + timer.time_remaining("train"))
            if trainer.world_size > 1:
                share_of_time = trainer.strategy.broadcast(share_of_time)
            share = max(share, share_of_time)
        return share

    return progress


def budget_timer(trainer: L.Trainer) -> Timer | None:
    """The ``Timer`` that ``trainer.max_time`` installs, or None where no time limit is set."""
    timers = [c for c in trainer.callbacks if isinstance(c, Timer)]
    return timers[0] if timers and timers[0].time_remaining() is not None else None


def warn_if_epochs_end_first(trainer: L.Trainer) -> None:
    """A budgeted schedule decays towards ``trainer.max_steps``; an epoch limit that ends
    training sooner leaves the rate undecayed (e.g. ``trainer.max_epochs=4`` on the
    12,000-update GPU recipe)."""
    steps = trainer.max_steps
    if steps <= 0 or trainer.max_epochs in (None, -1):
        return
    updates = trainer.estimated_stepping_batches  # the smaller of the two limits
    if updates < steps and trainer.is_global_zero:  # once, not once per rank
        log.warning(
            "trainer.max_epochs=%d ends training after about %d updates, before "
            "trainer.max_steps=%d, where the learning rate's decay ends: it will stop "
            "undecayed. Set the length with trainer.max_steps (and trainer.max_epochs=-1).",
            trainer.max_epochs,
            updates,
            steps,
        )
