"""Where the commands that write put their results, checked before they read or compute anything:
never over one of their own inputs, over an earlier result only when asked (``--force``), and a
directory replaced whole: built beside it, then swapped in.

Every refusal is a :class:`ConfigError` naming the path and the fix (the CLIs print it as one
``error:`` line). The run directories of ``train.py`` and ``evaluate.py`` follow the same rules
in :mod:`transformer.training.run_dir`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from transformer.atomic import sweep_temporaries, temporary_folder
from transformer.errors import ConfigError


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether ``a`` and ``b`` name one file: the same inode where both exist (another spelling,
    a symbolic or a hard link), else the same resolved path."""
    with contextlib.suppress(OSError):
        return os.path.samefile(a, b)
    return Path(a).resolve() == Path(b).resolve()


def check_not_input(
    output: str | os.PathLike,
    inputs: Iterable[str | os.PathLike],
    is_input: str,
    is_directory: str,
) -> None:
    """Refuse an ``output`` file that is one of the ``inputs`` or a directory: the messages are
    ``is_input`` and ``is_directory``, formatted with ``output`` (and ``given``, the input)."""
    for given in inputs:
        if same_file(output, given):
            raise ConfigError(is_input.format(output=output, given=given))
    if Path(output).is_dir():
        raise ConfigError(is_directory.format(output=output))


def check_output_file(
    output: str | os.PathLike,
    inputs: Iterable[str | os.PathLike],
    force: bool,
    name: str,
    hint: str = "",
) -> None:
    """A command writes the file ``output`` (its argument ``name``) from ``inputs``: refuse one of
    the inputs (even with ``force``), a directory, and an existing file unless ``force``; ``hint``
    ends the message of the last."""
    check_not_input(
        output,
        inputs,
        f"{name} {{output}} is the input {{given}}: writing it would destroy what it is made "
        f"from; give {name} a new path",
        f"{name} {{output}} is a directory; give the path of the file to write",
    )
    if Path(output).exists() and not force:
        raise ConfigError(
            f"{name} {output} exists; give a new path, or --force to replace it{hint}"
        )


def check_output_directory(
    out_dir: str | os.PathLike,
    inputs: Iterable[str | os.PathLike],
    force: bool,
    name: str,
    marker: str,
) -> None:
    """A command writes the directory ``out_dir`` (its argument ``name``) from ``inputs``, a
    ``marker`` file among what it writes: refuse the working directory or one above it, one that
    holds an input, and an existing non-empty one unless ``force``; ``force`` replaces only an
    earlier result of the command (a directory holding ``marker``)."""
    target = Path(out_dir).resolve()
    if target == Path.cwd() or target in Path.cwd().parents:
        raise ConfigError(
            f"{name} {out_dir} is the working directory or one above it, which the result would "
            f"replace; give {name} a new directory, e.g. {Path(out_dir) / 'model'}"
        )
    for given in inputs:
        if target in Path(given).resolve().parents:
            raise ConfigError(
                f"{name} {out_dir} holds the input {given}, which replacing it would delete; "
                f"give {name} a new directory"
            )
    if not target.exists() or (target.is_dir() and not any(target.iterdir())):
        return
    if not force:
        raise ConfigError(
            f"{name} {out_dir} exists and is not empty; choose another {name} or --force to "
            "replace it"
        )
    if not (target / marker).is_file():
        raise ConfigError(
            f"{name} {out_dir} is not one this command wrote (it has no {marker}); --force "
            f"replaces only those: give {name} a new directory"
        )


def replace_directory(out_dir: str | os.PathLike, write: Callable[[Path], Any]) -> None:
    """``write(directory)`` into a new temporary directory beside ``out_dir``, then swap it in:
    an earlier ``out_dir`` is moved aside, the new one renamed into place, the old deleted. A
    failure before the swap leaves ``out_dir`` as it was and no temporary directory (a killed
    process leaves its own, which the next write beside it removes); the earlier one is refused
    (:class:`ConfigError`) if it holds a file the new one does not (``--force`` replaces only
    what the command writes)."""
    target = Path(out_dir).resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    sweep_temporaries(target.parent)  # those of a killed earlier write
    with temporary_folder(target) as folder:
        tmp, old = folder / target.name, folder / f"{target.name}.old"
        tmp.mkdir()
        write(tmp)
        if target.exists():
            extra = sorted({p.name for p in target.iterdir()} - {p.name for p in tmp.iterdir()})
            if extra:
                raise ConfigError(
                    f"{out_dir} holds {', '.join(extra)}, which this command does not write; "
                    "--force replaces only what it writes: give a new directory"
                )
            os.replace(target, old)
        try:
            os.replace(tmp, target)
        except BaseException:
            if old.exists():
                os.replace(old, target)
            raise
