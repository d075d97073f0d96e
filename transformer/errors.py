"""An invalid option, and the ways training stops early on purpose; train.py reports each as one
``error:`` line."""

from __future__ import annotations


class ConfigError(ValueError):
    """An invalid option; the message names it (as typed on the command line) and the fix."""


class TrainingStopped(RuntimeError):
    """Training stopped before its end; the message says at which step and what was kept."""


class NonFiniteLoss(TrainingStopped):
    """The loss was NaN or inf for too many steps in a row."""


class Interrupted(TrainingStopped):
    """SIGTERM or SIGINT (Ctrl-C) stopped training after a checkpoint was written."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.signum = signum
