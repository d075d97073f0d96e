"""Files (and directories) that appear whole or not at all: write a temporary beside the target,
fsync it, then rename it over the target (``os.replace`` is atomic within a file system).

A crash, a kill or a full disk during the write leaves the previous file untouched, never a
truncated ``last.ckpt`` or ``metrics.json``. An exception (Ctrl-C included) removes the temporary;
a killed process (SIGKILL, power loss) leaves it, and :func:`sweep_temporaries` removes it later.

A temporary can only be ours: each write makes a folder of its own beside the target,
``.<name>.<token>.tmp/`` (``token``: 32 random hex digits), holding the temporary and a marker
file (:data:`MARKER`) that repeats the token, names the host, and is locked by the writer while
it writes. The sweep removes a folder only when its marker matches its name and this host, and
the lock is free: its writer is gone. Nothing else is touched, whatever its name: a user's
``.photos.2024.tmp/`` is not ours. The temporaries of earlier versions (``.<name>.<pid>.tmp``,
``.<name>.<pid>@<host>.tmp``) carry nothing but their name, which a user's file can share: they
are left alone.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import shutil
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import torch

HOST = socket.gethostname()
MARKER = "transformer-nmt-temporary.json"  # in each temporary folder: {"token", "host"}
_FOLDER = re.compile(r"\..+\.(?P<token>[0-9a-f]{32})\.tmp")


@contextlib.contextmanager
def temporary_folder(path: Path) -> Iterator[Path]:
    """A new folder beside ``path`` (in its directory: a rename from it to ``path`` is atomic)
    for the temporaries of one write, marked as ours and locked while the block runs; removed,
    with what is left in it, when the block ends. A killed process leaves it to
    :func:`sweep_temporaries`."""
    token = secrets.token_hex(16)
    folder = path.with_name(f".{path.name}.{token}.tmp")
    folder.mkdir()
    fd = os.open(folder / MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        with contextlib.suppress(OSError):  # a file system without locks: never swept
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, json.dumps({"token": token, "host": HOST}).encode())
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        os.close(fd)  # the lock goes with it


def sweep_temporaries(directory: str | os.PathLike) -> list[Path]:
    """Remove from ``directory`` the temporary folders (:func:`temporary_folder`) of writers
    that are gone: those whose marker is ours, of this host, and not locked. A running writer's
    is kept, and another host's (a shared disk: its writers cannot be seen from here), and any
    entry without our marker. Returns the folders removed."""
    removed: list[Path] = []
    directory = Path(directory)
    if not directory.is_dir():
        return removed
    for entry in directory.iterdir():
        match = _FOLDER.fullmatch(entry.name)
        if match is not None and _abandoned(entry, match["token"]):
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


def _abandoned(folder: Path, token: str) -> bool:
    """Whether ``folder`` (named with ``token``) is a temporary folder whose writer is gone: a
    folder, not a link, whose marker names ``token`` and this host, and is not locked."""
    if folder.is_symlink() or not folder.is_dir():
        return False
    try:
        fd = os.open(folder / MARKER, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:  # no marker: not ours
        return False
    try:
        owner = json.loads(os.read(fd, 4096))
        if owner["token"] != token or owner["host"] != HOST:
            return False
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held: its writer runs
    except (OSError, ValueError, TypeError, KeyError):  # running, or not our marker
        return False
    finally:
        os.close(fd)
    return True


def atomic_write(path: str | os.PathLike, write: Callable[[IO[bytes]], Any]) -> None:
    """Call ``write(file)`` on a temporary file, then move it to ``path`` in one step."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with temporary_folder(path) as folder:
        tmp = folder / path.name
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    with contextlib.suppress(OSError):  # make the rename itself durable
        _fsync(path.parent)


def atomic_directory(path: str | os.PathLike, write: Callable[[Path], Any]) -> None:
    """Call ``write(directory)`` on a temporary directory, fsync every file in it, then move it
    to ``path`` in one step; a failure (a full disk) removes it. If another process (another
    node) moved the same directory into place first, theirs is kept."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with temporary_folder(path) as folder:
        tmp = folder / path.name
        try:
            write(tmp)
            for f in [*(p for p in tmp.rglob("*") if p.is_file()), tmp]:
                _fsync(f)
            os.replace(tmp, path)
        except BaseException:
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
