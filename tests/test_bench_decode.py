"""bench/bench_decode.py and bench/bench_attention.py at tiny sizes on CPU: they run and report
every system and shape (the GPU runs use the same scripts)."""

import importlib.util
import os
import re
import subprocess
import sys

import pytest

from tests.tiny import REPO


def run(script: str, *args: str) -> str:
    cmd = [sys.executable, str(REPO / "bench" / script), *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_bench_attention_reports_every_shape() -> None:
    out = run("bench_attention.py", "--device", "cpu", "--repeat", "1")
    rows = [line for line in out.splitlines() if re.match(r"\| (train|decode):", line)]
    assert len(rows) == 4
    assert all(re.search(r"( \d+\.\d\d ms \|){3} \d+\.\d\dx \|$", row) for row in rows)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("bench_decode_cache")  # one tokenizer for both runs


@pytest.mark.skipif(
    not os.environ.get("MULTI30K_DIR"), reason="MULTI30K_DIR is not set to the Multi30k files"
)
@pytest.mark.parametrize(
    ("lengths", "batching", "batches"),
    [("equal", ["--batch", "5"], 3), ("reference", ["--max-tokens", "64"], None)],
)
def test_bench_decode_tiny(cache_dir, lengths: str, batching: list[str], batches) -> None:
    marian = importlib.util.find_spec("transformers") is not None
    out = run(
        "bench_decode.py", "--root", os.environ["MULTI30K_DIR"], "--cache-dir", str(cache_dir),
        "--limit", "12", "--vocab", "500", "--d-model", "32", "--heads", "2", "--layers", "1",
        "--d-ff", "64", "--lengths", lengths, "--length", "4", *batching,
        *([] if marian else ["--no-marian"]),
    )  # fmt: skip
    header = out.splitlines()[0]
    assert "sentences=12 " in header and f"lengths={lengths}" in header
    count = int(re.search(r"batches=(\d+)", header).group(1))
    assert count == batches if batches else count > 1  # --max-tokens 64: a few sentences each
    assert re.search(r"over ours, uncached: \d+\.\d\dx", out)
    assert ("over MarianMTModel.generate" in out) == marian
