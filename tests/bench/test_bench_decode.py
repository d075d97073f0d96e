"""bench/bench_decode.py and bench/bench_attention.py at tiny sizes on CPU: they run and report
every system and shape (the GPU runs use the same scripts)."""

import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest

from tests.tiny import REPO

pytestmark = pytest.mark.bench  # a script of bench/ or dev/


def run(script: str, *args: str) -> str:
    cmd = [sys.executable, str(REPO / "bench" / script), *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.slow
def test_bench_attention_reports_every_shape() -> None:
    out = run("bench_attention.py", "--device", "cpu", "--repeat", "1")
    rows = [line for line in out.splitlines() if re.match(r"\| (train|decode):", line)]
    assert len(rows) == 4
    assert all(re.search(r"( \d+\.\d\d ms \|){3} \d+\.\d\dx \|$", row) for row in rows)


@pytest.mark.skipif(
    not os.environ.get("MULTI30K_DIR"), reason="MULTI30K_DIR is not set to the Multi30k files"
)
@pytest.mark.slow
def test_bench_decode_dry_run_reports_every_system_and_search(tmp_path) -> None:
    marian = importlib.util.find_spec("transformers") is not None
    ct2 = importlib.util.find_spec("ctranslate2") is not None
    out = run(
        "bench_decode.py", "--root", os.environ["MULTI30K_DIR"], "--cache-dir", str(tmp_path),
        "--dry-run", "--uncached", "--lengths", "reference", "--max-tokens", "64",
        "--out", str(tmp_path / "seconds.json"),
    )  # fmt: skip
    header, backend = out.splitlines()[:2]
    assert "sentences=12 " in header and "lengths=reference" in header
    assert int(re.search(r"batches=(\d+)", header).group(1)) > 1  # a few sentences each
    assert backend.startswith("ours: decoding on cpu in float32: oneDNN")
    for search in ("beam 5", "greedy"):
        table = out.split(f"\n{search}:\n")[1].split("\n\n")[0]
        assert re.search(r"\| ours, uncached \| [\d.]+ \| [\d.]+ \| \d+ \| \d+\.\d\dx", table)
        assert ("| MarianMTModel.generate |" in table) == marian
        assert ("| CTranslate2 (float32) |" in table) == ct2
    seconds = json.loads((tmp_path / "seconds.json").read_text())["seconds"]
    batches = int(re.search(r"batches=(\d+)", header).group(1))
    assert all(len(times) == batches for times in seconds["beam"].values())
