"""dev/gpu_check.sh step (the product's training step and the options that may speed it up),
dry-run on CPU: bench_train's runs with their variants (those that would repeat another's tiny
work composed only), the time by category, the options' CUDA tests collected."""

from __future__ import annotations

import json
import re

import pytest

from tests.dev.gpu_check_dry import check_stage, dry_fixture, read

pytestmark = [pytest.mark.slow, pytest.mark.bench, pytest.mark.heavy]
dry = dry_fixture("step")  # the stage's dry run, once for the module


def test_step_stage_exits_0_with_a_row_per_system_and_its_time_by_category(dry) -> None:
    results = check_stage("step", dry)
    systems = {
        "base": ["ours", "ours, compiled loss", "ours, layers", "torch.nn.Transformer"],
        "recipe": ["ours", "ours, layers", "ours, CUDA graphs"],
    }
    for run, names in systems.items():
        for name in names:
            assert re.search(rf"^\| {run} \| {name} \| [\d,]+ \| ", results, re.M), (run, name)
    categories = re.findall(r"^\| (\S+) \| (ours[^|]*) \|(?: [\d.]+ \(\d+%\) \|){6}", results, re.M)
    assert ("recipe", "ours, CUDA graphs") in categories and len(categories) == 6
    assert re.search(r"CUDA tests of the options .*\d+ tests? collected", results)


def test_big_and_base_graphs_are_composed_with_their_variants_not_trained_again(dry) -> None:
    summary, bench = read(dry[1], "summary.txt"), read(dry[1], "step_bench.txt")
    for run in ("big", "base-graphs"):  # the tiny work of base and recipe again: composed only
        assert re.search(rf"^\| step \| bench_train {run} \| ok \| \d+ \| dry run: composed only",
                         summary, re.M)  # fmt: skip
    composed = re.findall(r"^(ours[^:]*): d_model=(\d+) .* compile=(\w+); train\.py model=(\w+) ",
                          bench, re.M)  # fmt: skip
    assert composed == [("ours", "1024", "False", "big"), ("ours", "512", "False", "base"),
                        ("ours, compiled", "512", "True", "base"),
                        ("ours, CUDA graphs", "512", "True", "base")]  # fmt: skip
    assert re.search(r"^ours, CUDA graphs: .* data\.num_buckets=4 data\.pad_to_multiple=8$",
                     bench, re.M)  # fmt: skip


def test_the_runs_keep_their_steps_and_the_liger_loss_is_left_out_of_a_dry_run(dry) -> None:
    runs = json.loads(read(dry[1], "step_runs.json"))
    assert list(runs) == ["base", "recipe"]
    for run in runs.values():
        assert {s["phase"] for s in run["steps"]} == {"warm", "timed"}
        for row in run["systems"]:
            assert (row["categories"] is not None) == row["name"].startswith("ours")
    graphs = next(r for r in runs["recipe"]["systems"] if r["name"] == "ours, CUDA graphs")
    assert graphs["padding"] > next(r for r in runs["recipe"]["systems"])["padding"]
    summary = read(dry[1], "summary.txt")
    assert re.search(r"^\| step \| liger-kernel \| skip \|", summary, re.M)
    assert "loss.kernel=liger" not in read(dry[1], "step_bench.txt")
