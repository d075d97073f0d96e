"""dev/gpu_check.sh stage recipe (the GPU recipe), dry-run on CPU: it trains in two calls, the
second resuming the first, then evaluates the average on the three test sets."""

from __future__ import annotations

import json
import re

import pytest

from tests.dev.gpu_check_dry import SPLITS, check_stage, dry_fixture, read

pytestmark = [pytest.mark.slow, pytest.mark.bench, pytest.mark.heavy]
dry = dry_fixture("recipe")  # the stage's dry run, once for the module


def test_stage_recipe_exits_0_with_its_files_and_a_score_table(dry) -> None:
    results = check_stage("recipe", dry)
    assert "| test_2016_flickr |" in results


def test_recipe_trains_resumes_and_evaluates(dry) -> None:
    log = read(dry[1], "recipe.log")
    commands = re.findall(r"^\$ .*train\.py experiment=multi30k_en_de.*$", log, re.M)
    assert len(commands) == 2 and "ckpt_path=" not in commands[0]
    assert re.search(r"ckpt_path=\S+/checkpoints/last\.ckpt", commands[1])  # the resume
    # the updates bound it, not a time limit (which would end the recipe's decay within a call)
    assert not any("max_time" in c for c in commands)
    assert "trainer.max_steps=4" in commands[0] and "trainer.max_steps=6" in commands[1]
    assert "Restored all states from the checkpoint" in log
    first_call = log.split("Restored all states")[0]
    assert "global_step=4" in first_call and "epoch_checkpoints=1" in first_call  # cut in epoch 2
    assert len(re.findall(r"^BLEU = \d+\.\d\d ", log, re.M)) == 3  # evaluate.py, three splits
    metrics = json.loads(read(dry[1], "recipe_metrics.json"))
    training = metrics["training"]
    assert training["finished"] and training["global_step"] == training["max_steps"] == 6
    assert [c["resumed"] for c in metrics["training_calls"]] == [0, 1]
    assert metrics["profile"]["attention_maps"]["seconds"] > 0  # its cost, from the profiler
    assert set(metrics["evaluations"]) == set(SPLITS)
    for e in metrics["evaluations"].values():  # the average spans the resume
        assert all(isinstance(e[k], float) for k in ("bleu", "bleu_lc", "chrf"))
        assert e["checkpoints_averaged"] == 2 and e["beam_size"] == 5
        assert e["eval_wall_seconds"] > 0
