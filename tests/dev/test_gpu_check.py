"""dev/gpu_check.sh, the checks a session runs when a GPU is lent: its stages (training speed,
the recipe's pace, decoding and tests, the recipe), dry-run on CPU (tiny model, synthetic corpus,
bench scripts at their test sizes) in test_gpu_check_{stage1,stage2,stage3,recipe}.py, a file a
stage; here, what needs no dry run: the files each stage leaves, reading checkpoints safely, the
refusals."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.dev.gpu_check_dry import HELPER, SHARED, STAGE_FILES, run
from tests.tiny import REPO

pytestmark = pytest.mark.bench  # a script of bench/ or dev/


def test_every_stage_leaves_at_most_eight_files() -> None:
    assert all(len(SHARED | files) <= 8 for files in STAGE_FILES.values())  # the GPU tool's limit


class Planted:
    """Unpickling it writes a file: what a checkpoint with pickled code could do on load."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "ran"))


@pytest.mark.slow
def test_run_info_loads_checkpoints_safely(tmp_path) -> None:
    """gpu_check.py reads last.ckpt as the project does (weights_only: tensors and plain values):
    a checkpoint carrying pickled code is refused in one error line, and the code never runs."""
    marker = tmp_path / "ran.txt"
    (tmp_path / "checkpoints").mkdir()
    ckpt = {"state_dict": {}, "hyper_parameters": {"model": {}}, "planted": Planted(marker)}
    torch.save(ckpt, tmp_path / "checkpoints" / "last.ckpt")
    done = subprocess.run(
        [sys.executable, str(HELPER), "run-info", str(tmp_path)],
        capture_output=True, text=True, cwd=REPO,
    )  # fmt: skip
    assert not marker.exists()
    assert done.returncode == 1 and "Traceback" not in done.stderr  # one line, as train.py's
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .startswith(f"error: checkpoint {tmp_path / 'checkpoints' / 'last.ckpt'} cannot be read")
    )


@pytest.mark.slow
def test_run_info_reads_the_precision_lightning_chose(tmp_path) -> None:
    log = tmp_path / "train.log"
    for line, precision in [("Using bfloat16 Automatic Mixed Precision (AMP)", "bf16-mixed"),
                            ("Using 16bit Automatic Mixed Precision (AMP)", "16-mixed"),
                            ("GPU available: False, used: False", "32-true (no AMP)")]:  # fmt: skip
        log.write_text(f"Seed set to 1234\n{line}\n")
        done = subprocess.run(
            [sys.executable, str(HELPER), "run-info", str(tmp_path),
             "--log", str(log)], capture_output=True, text=True, check=True,
        )  # fmt: skip
        assert f"precision={precision}\n" in done.stdout and "last_ckpt=missing" in done.stdout


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU this would run stage 1 for real")
def test_a_real_run_without_a_gpu_stops_at_once(tmp_path) -> None:
    done = run("1", "--out", str(tmp_path), timeout=120)
    assert done.returncode == 1
    assert "torch sees no CUDA device; on a CPU machine use --dry-run" in done.stdout


def test_bad_arguments_print_the_usage() -> None:
    for args in (["4"], [], ["1", "--fast"]):
        done = run(*args, timeout=30)
        assert done.returncode == 2 and "--dry-run" in done.stderr, args
