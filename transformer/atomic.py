"""Files (and directories) that appear whole or not at all: write a temporary file beside the
target, fsync it, then rename it over the target (``os.replace`` is atomic within a directory).

A crash, a kill or a full disk during the write leaves the previous file untouched, never a
truncated ``last.ckpt`` or ``metrics.json``. An exception (Ctrl-C included) removes the temporary;
a killed process (SIGKILL, power loss) leaves it, ``.<name>.<pid>@<host>.tmp``, and
:func:`sweep_temporaries` removes it once that process is gone.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import torch

HOST = socket.gethostname()
# temporary_path's names; also those of earlier versions: no host (this host's), and
# SentencePiece's files trained under a temporary prefix (.<name>.<pid>.tmp.model and .vocab)
_TEMPORARY = re.compile(r"\..+\.(?P<pid>\d+)(?:@(?P<host>[^/]+))?\.tmp(?:\.model|\.vocab)?")


def temporary_path(path: Path) -> Path:
    """Where ``path`` is written before it is renamed into place: beside it, hidden, named by
    this process and host (two writers never share one; :func:`sweep_temporaries` can tell
    whether its writer still runs)."""
    return path.with_name(f".{path.name}.{os.getpid()}@{HOST}.tmp")


def sweep_temporaries(directory: str | os.PathLike) -> list[Path]:
    """Remove from ``directory`` the temporaries (:func:`temporary_path`'s files and
    directories) of writers that were killed: processes of this host that no longer run. Those
    of running processes, and of other hosts (a shared disk: their processes cannot be seen
    from here), are kept. Returns the paths removed."""
    removed: list[Path] = []
    directory = Path(directory)
    if not directory.is_dir():
        return removed
    for entry in directory.iterdir():
        match = _TEMPORARY.fullmatch(entry.name)
        if match is None or match["host"] not in (None, HOST) or _runs(int(match["pid"])):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        removed.append(entry)
    return removed


def _runs(pid: int) -> bool:
    """Whether process ``pid`` of this host runs (a zombie counts: its parent has not reaped
    it yet)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True


def atomic_write(path: str | os.PathLike, write: Callable[[IO[bytes]], Any]) -> None:
    """Call ``write(file)`` on a temporary file, then move it to ``path`` in one step."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_path(path)
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    with contextlib.suppress(OSError):  # make the rename itself durable
        _fsync(path.parent)


def atomic_directory(path: str | os.PathLike, write: Callable[[Path], Any]) -> None:
    """Call ``write(directory)`` on a temporary directory, fsync every file in it, then move it
    to ``path`` in one step; a failure (a full disk) removes it. If another process (another
    node) moved the same directory into place first, theirs is kept."""
    path = Path(path)
    tmp = temporary_path(path)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        write(tmp)
        for f in [*(p for p in tmp.rglob("*") if p.is_file()), tmp]:
            _fsync(f)
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if not path.is_dir():
            raise
        return  # os.replace refused: ``path`` was put there meanwhile, whole
    with contextlib.suppress(OSError):
        _fsync(path.parent)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_save(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save(obj, path)``, atomically."""
    atomic_write(path, lambda f: torch.save(obj, f))


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write(path, lambda f: f.write(text.encode("utf-8")))
