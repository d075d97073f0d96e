"""The bench scripts that read a checkpoint: a damaged one (or no checkpoint at all) is one
``error:`` line naming it and exit status 1, as train.py and evaluate.py report it, no
traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.tiny import REPO

pytestmark = [pytest.mark.bench, pytest.mark.slow]

SCRIPTS = {  # script -> its arguments after the checkpoint ({corpus}, {text}: filled in below)
    "bench_constraints.py": ["--source", "{text}", "--reference", "{text}"],
    "bench_ct2.py": ["--root", "{corpus}", "--split", "test"],
    "bench_length_buckets.py": ["--data", "{corpus}"],
    "bench_prune.py": [],
    "bench_serve.py": ["--source", "{text}", "--clients", "1", "--requests", "1"],
    "bench_translate.py": ["--source", "{text}"],
    "bench_validation.py": ["--data", "{corpus}"],
}


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_damaged_checkpoint_is_one_error_line(script, corpus, tmp_path) -> None:
    ckpt, text = tmp_path / "last.ckpt", tmp_path / "text.txt"
    ckpt.write_bytes(b"PK\x03\x04 cut short")
    text.write_text("a dog runs\n")
    args = [a.format(corpus=corpus, text=text) for a in SCRIPTS[script]]
    done = subprocess.run([sys.executable, str(REPO / "bench" / script), str(ckpt), *args],
                          capture_output=True, text=True, cwd=REPO, timeout=300)  # fmt: skip
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .startswith(f"error: checkpoint {ckpt} cannot be read, it is truncated or not a checkpoint")
    )
