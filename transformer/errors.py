"""The user-error family. train.py and evaluate.py print a :class:`UserError` as one ``error:``
line and exit 1; any other exception is a bug and keeps its traceback.

The option, data and checkpoint errors are ValueErrors too, and the training stops RuntimeErrors,
as they were before the family existed: code that catches those keeps catching them.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any


class UserError(Exception):
    """An error the user can fix; the message names the file, field or option and the fix.
    train.py and evaluate.py print it as one ``error:`` line, no traceback."""


class ConfigError(UserError, ValueError):
    """An invalid option; the message names it (as typed on the command line) and the fix."""


class DataError(UserError, ValueError):
    """Unusable input data; the message says what is wrong and what would fix it."""


class GuideError(DataError):
    """A line's prefix or constraint the model cannot take; ``option`` (``prefixes``,
    ``constraints``) says which, for the caller that read it from a file to name the file."""

    def __init__(self, message: str, option: str) -> None:
        super().__init__(message)
        self.option = option


class CheckpointError(UserError, ValueError):
    """A checkpoint that cannot be used; the message names the file and what is wrong."""


class TrainingStopped(UserError, RuntimeError):
    """Training stopped before its end on purpose; the message says at which step and what was
    kept."""


class NonFiniteLoss(TrainingStopped):
    """The loss or gradients were NaN or inf for too many steps in a row."""


class Interrupted(TrainingStopped):
    """SIGTERM or SIGINT (Ctrl-C) stopped training after a checkpoint was written."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.signum = signum


@contextlib.contextmanager
def one_line_errors() -> Iterator[None]:
    """A command's body (the scripts of ``bench/`` and ``dev/``): a :class:`UserError` ends it
    as it ends train.py, one ``error:`` line and exit status 1, no traceback."""
    try:
        yield
    except UserError as err:
        sys.exit(f"error: {err}")


def show(value: Any) -> str:
    """A value as it is written on the command line."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list | tuple):
        return "[" + ",".join(map(show, value)) + "]"
    return str(value)
