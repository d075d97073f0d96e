"""dev/gpu_check.sh stage 1 (training speed), dry-run on CPU: bench_train on the tiny model, each
step's timings kept, every other preset's config composed, the machine named."""

from __future__ import annotations

import json
import re

import pytest

from tests.dev.gpu_check_dry import check_stage, dry_fixture, read

pytestmark = [pytest.mark.slow, pytest.mark.bench, pytest.mark.heavy]
dry = dry_fixture("1")  # the stage's dry run, once for the module


def test_stage_1_exits_0_with_its_files_and_a_table_per_trained_run(dry) -> None:
    results = check_stage("1", dry)
    # bench_train: ours and its peers on the tiny model, then ours against ours compiled
    assert re.search(r"^\| recipe \| ours \| [\d,]+ \| [\d.]+ / [\d.]+ / [\d.]+ \|", results, re.M)
    assert re.search(r"^\| recipe \| torch\.nn\.Transformer \| .* \| [\d.]+x \|$", results, re.M)
    assert re.search(r"^\| recipe-compiled \| ours, compiled \| .* \| [\d.]+x \|$", results, re.M)
    summary = read(dry[1], "summary.txt")
    for run in ("base", "big", "base-compiled"):  # the same tiny work again: composed only
        assert re.search(rf"^\| 1 \| bench_train {run} \| ok \| \d+ \| dry run: composed only",
                         summary, re.M)  # fmt: skip


def test_env_file_names_the_machine(dry) -> None:
    env = read(dry[1], "env.txt")
    for key in ("python", "torch", "torch_cuda", "cuda_available", "bf16_supported", "lightning",
                "hydra", "datasets", "wandb", "sentencepiece", "sacrebleu",
                "flash_attention_impl"):  # fmt: skip
        assert re.search(rf"^{key}=\S", env, re.M), key
    assert "NOT IMPORTABLE" not in env.split("\ntriton=")[0]  # torch and lightning import
    assert re.search(r"^sdpa_bf16_masked=ok", env, re.M)


def test_training_bench_keeps_every_step_and_composes_each_presets_own_config(dry) -> None:
    bench = read(dry[1], "train_bench.txt")
    commands = re.findall(r"^\$ .*bench_train\.py --preset (\w+) (--\S+) .*$", bench, re.M)
    assert commands == [("recipe", "--dry-run"), ("base", "--compose-only"),
                        ("big", "--compose-only"), ("recipe", "--dry-run"),
                        ("base", "--compose-only")]  # fmt: skip
    assert len(re.findall(r"^\| ours \| [\d.]+M \| [\d,]+ \|", bench, re.M)) == 2
    # the presets' own models, checked as train.py checks them, and the compiled variant's
    composed = re.findall(r"^(ours[^:]*): d_model=(\d+) .* compile=(\w+); train\.py model=(\w+) ",
                          bench, re.M)  # fmt: skip
    assert composed == [("ours", "512", "False", "base"), ("ours", "1024", "False", "big"),
                        ("ours", "512", "False", "base"),
                        ("ours, compiled", "512", "True", "base")]  # fmt: skip
    runs = json.loads(read(dry[1], "train_steps.json"))
    assert list(runs) == ["recipe", "recipe-compiled"]
    for label, run in runs.items():
        names = [r["name"] for r in run["systems"]]
        if label.endswith("-compiled"):
            assert names == ["ours", "ours, compiled"]
        else:
            assert names[0] == "ours" and "torch.nn.Transformer" in names
        phases = {s["phase"] for s in run["steps"]}
        assert phases == {"warm", "timed"} and run["options"]["data"]  # Multi30k-named files
