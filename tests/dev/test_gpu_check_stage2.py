"""dev/gpu_check.sh stage 2 (the recipe's pace), dry-run on CPU: the recipe's runs measured one
by one, what each part of a validation costs."""

from __future__ import annotations

import json
import re

import pytest

from tests.dev.gpu_check_dry import check_stage, dry_fixture, read

pytestmark = [pytest.mark.slow, pytest.mark.bench, pytest.mark.heavy]
dry = dry_fixture("2")  # the stage's dry run, once for the module


def test_stage_2_exits_0_with_its_files_and_the_pace_table(dry) -> None:
    results = check_stage("2", dry)
    assert re.search(r"^\| recipe \| `-` \| 6 \| [\d.]+ \| [\d.]+ \| - \|", results, re.M)
    assert re.search(r"^Training steps' share of the recipe's fit loop .*: \d+%$", results, re.M)
    assert "| attention maps: the training thread |" in results


def test_the_recipes_pace_is_measured_run_by_run(dry) -> None:
    log = read(dry[1], "recipe_pace.log")
    commands = re.findall(r"^\$ .*train\.py experiment=multi30k_en_de .*$", log, re.M)
    assert len(commands) == 5 and all("SimpleProfiler" in c for c in commands)
    for change in ("trainer.enable_progress_bar=false", "validation.max_tokens=4096",
                   "compile=true", "trainer.limit_val_batches=0"):  # fmt: skip
        assert sum(change in c for c in commands) == 1, change
    runs = json.loads(read(dry[1], "recipe_pace.json"))["runs"]
    assert [r["variant"] for r in runs] == ["recipe", "no validation"]  # the dry run trains two
    for r in runs:
        assert r["updates"] == 6 and r["fit_loop_s"] > 0 and r["updates_per_s"] > 0
    assert runs[0]["attention_analyses"] == 1 and runs[1]["attention_analyses"] == 0
    assert runs[0]["profile_s"]["attention_maps"] > 0
    validation = read(dry[1], "validation.txt")
    for part in ("validation loss, 256-token batches", "greedy decoding of 16 sentences, 2048",
                 "BLEU, BLEU -lc and chrF", "attention maps: the training thread",
                 "attention maps: the worker process"):  # fmt: skip
        assert re.search(rf"^\| {re.escape(part)}.* \| \d+\.\d\d \|$", validation, re.M), part
