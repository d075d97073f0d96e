"""bench_serve.py: the server's translations are the same whether the requests that wait are
decoded one at a time or together, and the table says so (one md5 for every setting)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.tiny import REPO, compose_cfg, script_env, tiny_overrides
from transformer.training import train

pytestmark = [pytest.mark.bench, pytest.mark.slow]


def test_every_setting_answers_the_same(corpus, tmp_path) -> None:
    train(compose_cfg([*tiny_overrides(corpus), "trainer.max_steps=40"], tmp_path / "run"))
    command = [sys.executable, str(REPO / "bench" / "bench_serve.py"),
               str(tmp_path / "run" / "checkpoints" / "last.ckpt"),
               "--source", str(corpus / "test.en"), "--device", "cpu", "--batch-lines", "1,8",
               "--clients", "4", "--requests", "2", "--lines", "2", "--beam", "3"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=300,
                          env=script_env(tmp_path))  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rows = re.findall(
        r"^\| (\d+) \| ([\d.]+) \| [\d.]+ \| [\d.]+ \| (\w{8}) \|$", done.stdout, re.M
    )
    assert [r[0] for r in rows] == ["1", "8"] and all(float(r[1]) > 0 for r in rows)
    assert rows[0][2] == rows[1][2]
