"""dev/gpu_check.sh stage 1 (training speed), dry-run on CPU: bench_train at every size, each
step's timings kept, the machine named."""

from __future__ import annotations

import json
import re

import pytest

from tests.dev.gpu_check_dry import check_stage, dry_fixture, read

pytestmark = [pytest.mark.slow, pytest.mark.bench, pytest.mark.heavy]
dry = dry_fixture("1")  # the stage's dry run, once for the module


def test_stage_1_exits_0_with_its_files_and_a_table_per_size(dry) -> None:
    results = check_stage("1", dry)
    for preset in ("recipe", "base", "big"):  # bench_train: ours and its peer at each size
        assert re.search(rf"^\| {preset} \| ours \| [\d,]+ \| [\d.]+ / [\d.]+ / [\d.]+ \|",
                         results, re.M)  # fmt: skip
        assert re.search(rf"^\| {preset} \| torch\.nn\.Transformer \| .* \| [\d.]+x \|$",
                         results, re.M)  # fmt: skip
    assert re.search(r"^\| recipe-compiled \| ours, compiled \| .* \| [\d.]+x \|$", results, re.M)


def test_env_file_names_the_machine(dry) -> None:
    env = read(dry[1], "env.txt")
    for key in ("python", "torch", "torch_cuda", "cuda_available", "bf16_supported", "lightning",
                "hydra", "datasets", "wandb", "sentencepiece", "sacrebleu",
                "flash_attention_impl"):  # fmt: skip
        assert re.search(rf"^{key}=\S", env, re.M), key
    assert "NOT IMPORTABLE" not in env.split("\ntriton=")[0]  # torch and lightning import
    assert re.search(r"^sdpa_bf16_masked=ok", env, re.M)


def test_training_bench_keeps_every_step_of_every_size(dry) -> None:
    bench = read(dry[1], "train_bench.txt")
    commands = re.findall(r"^\$ .*bench_train\.py --preset (\w+) .*$", bench, re.M)
    assert commands == ["recipe", "base", "big", "recipe", "base"]
    assert len(re.findall(r"^\| ours \| [\d.]+M \| [\d,]+ \|", bench, re.M)) == 5
    runs = json.loads(read(dry[1], "train_steps.json"))
    assert list(runs) == ["recipe", "base", "big", "recipe-compiled", "base-compiled"]
    for label, run in runs.items():
        names = [r["name"] for r in run["systems"]]
        if label.endswith("-compiled"):
            assert names == ["ours", "ours, compiled"]
        else:
            assert names[0] == "ours" and "torch.nn.Transformer" in names
        phases = {s["phase"] for s in run["steps"]}
        assert phases == {"warm", "timed"} and run["options"]["data"]  # Multi30k-named files
