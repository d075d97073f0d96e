"""transformer.outputs.replace_directory: a directory replaced whole, and what a killed write
leaves removed by the next."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tiny import REPO
from transformer.atomic import temporary_folder
from transformer.outputs import replace_directory

# replace_directory in another process, stopped inside its write (SIGKILL: no cleanup runs)
KILLED_WRITE = (
    "import sys, time; from transformer.outputs import replace_directory; "
    "replace_directory(sys.argv[1], lambda d: ((d / 'model.bin').write_bytes(bytes(1 << 20)), "
    "print(flush=True), time.sleep(300)))"
)


def test_the_next_write_removes_what_a_killed_write_left(tmp_path: Path) -> None:
    """A write killed mid-way leaves its temporary folder beside the target (marked as ours); the
    next write there removes it, and keeps a running writer's."""
    target = tmp_path / "EXPORT"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    killed = subprocess.Popen(
        [sys.executable, "-c", KILLED_WRITE, str(target)], env=env, stdout=subprocess.PIPE
    )
    killed.stdout.readline()  # the temporary directory is written
    killed.kill()
    killed.wait()
    (left,) = tmp_path.iterdir()
    assert left.name.startswith(".EXPORT.") and left.name.endswith(".tmp")
    assert (left / "EXPORT" / "model.bin").is_file()
    with temporary_folder(tmp_path / "OTHER") as running:  # a running writer's
        replace_directory(target, lambda d: (d / "model.bin").write_bytes(b"new"))
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["EXPORT", running.name])
    assert (target / "model.bin").read_bytes() == b"new"


def test_a_failed_write_leaves_the_earlier_directory_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "EXPORT"
    replace_directory(target, lambda d: (d / "model.bin").write_bytes(b"first"))

    def fail(d: Path) -> None:
        (d / "model.bin").write_bytes(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        replace_directory(target, fail)
    assert [p.name for p in tmp_path.iterdir()] == ["EXPORT"]
    assert (target / "model.bin").read_bytes() == b"first"
