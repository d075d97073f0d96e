"""What the dry-run tests of dev/gpu_check.sh share: the script run one stage at a time (a test
file a stage, so ``pytest -n --dist loadfile`` runs the stages side by side), and the checks every
stage must pass."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tiny import REPO

SCRIPT = REPO / "dev" / "gpu_check.sh"
HELPER = REPO / "dev" / "gpu_check.py"
SHARED = {"env.txt", "summary.txt", "results.md"}  # every stage writes these
STAGE_FILES = {
    "1": {"train_bench.txt", "train_steps.json"},
    "2": {"recipe_pace.log", "recipe_pace.json", "validation.txt"},
    "3": {"decode.txt", "tests.log", "tests.xml"},
    "step": {"step_bench.txt", "step_runs.json", "step_tests.log"},
    "recipe": {"recipe.log", "recipe_metrics.json"},
}
SPLITS = ("test_2016_flickr", "test_2017_flickr", "test_2017_mscoco")
# the summary rows each stage must show as ok
STEPS = {
    "1": ["env", "bench_train recipe", "bench_train base", "bench_train big",
          "bench_train recipe-compiled", "bench_train base-compiled"],
    "2": ["pace: recipe", "pace: no progress bar", "pace: no validation",
          "pace: validation batches of 4096", "pace: compiled", "bench_validation"],
    "3": ["bench_decode reference", "bench_decode equal", "bench_attention",
          "pytest GPU-relevant files"],
    "step": ["bench_train base", "bench_train recipe", "bench_train big",
             "bench_train base-graphs", "pytest step options"],
    "recipe": ["recipe train (call 1)", "recipe train (call 2)",
               *[f"evaluate {s}" for s in SPLITS]],
}  # fmt: skip


def run(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "PYTHON": sys.executable}  # fmt: skip
    env.pop("OUT", None)  # the GPU tool's folder: --out names ours
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=REPO)  # fmt: skip


def dry_run(stage: str, out: Path) -> tuple[subprocess.CompletedProcess, Path]:
    """``bash dev/gpu_check.sh STAGE --dry-run --out OUT``: its process and its folder."""
    return run(stage, "--dry-run", "--out", str(out)), out


def dry_fixture(stage: str):
    """The module's ``dry`` fixture: the stage's dry run, run once for its tests."""

    @pytest.fixture(scope="module")
    def dry(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
        return dry_run(stage, tmp_path_factory.mktemp(f"gpu_check_{stage}"))

    return dry


def read(out: Path, name: str) -> str:
    return (out / name).read_text()


def check_stage(stage: str, dry: tuple[subprocess.CompletedProcess, Path]) -> str:
    """What every stage must do: exit 0 with its files alone, every step of its summary table ok
    (then the results last on stdout), one results table titled with its command, naming the
    machine and the code. Returns results.md."""
    done, out = dry
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert {p.name for p in out.iterdir()} == SHARED | STAGE_FILES[stage]
    assert done.stdout.rstrip().endswith(read(out, "results.md").rstrip())  # the end of stdout
    lines = read(out, "summary.txt").splitlines()
    rows = [r.split(" | ") for r in lines if re.match(r"\| ([123]|step|recipe) \|", r)]
    steps = {(r[0].strip("| "), r[1]): r[2] for r in rows}
    # warn: e.g. no cuda-marked test yet; skip: what a dry run leaves out (the liger loss)
    assert set(steps.values()) <= {"ok", "warn", "skip"}, rows
    for step in STEPS[stage]:
        assert steps.get((stage, step)) == "ok", (stage, step, rows)
    results = read(out, "results.md")
    titles = re.findall(r"^### (.*) \(\d{4}-\d\d-\d\d, `bash dev/gpu_check.sh (\S+)`\)$",
                        results, re.M)  # fmt: skip
    assert [s for _, s in titles] == [stage]
    assert "torch 2." in results and "commit " in results  # the machine and the code
    return results
