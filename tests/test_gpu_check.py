"""bench/gpu_check.sh, the checks a session runs when a GPU is lent: its stages (training speed,
the recipe's pace, decoding and tests, the recipe), dry-run on CPU (tiny model, synthetic corpus,
bench scripts at their test sizes), run every command line a real run uses, and each step leaves
what it must (an empty or missing result fails here)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch

from tests.tiny import REPO

SCRIPT = REPO / "bench" / "gpu_check.sh"
SHARED = {"env.txt", "summary.txt", "results.md"}  # every stage writes these
STAGE_FILES = {
    "1": {"train_bench.txt", "train_steps.json"},
    "2": {"recipe_pace.log", "recipe_pace.json", "validation.txt"},
    "3": {"decode.txt", "tests.log", "tests.xml"},
    "recipe": {"recipe.log", "recipe_metrics.json"},
}
SPLITS = ("test_2016_flickr", "test_2017_flickr", "test_2017_mscoco")


def run(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "PYTHON": sys.executable}  # fmt: skip
    env.pop("OUT", None)  # the GPU tool's folder: --out names ours
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=REPO)  # fmt: skip


@pytest.fixture(scope="module")
def dry(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path_factory.mktemp("gpu_check_out")
    return run("all", "--dry-run", "--out", str(out)), out


def read(out: Path, name: str) -> str:
    return (out / name).read_text()


def test_all_stages_exit_0_within_eight_files_each(dry) -> None:
    done, out = dry
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert {p.name for p in out.iterdir()} == SHARED.union(*STAGE_FILES.values())
    assert all(len(SHARED | files) <= 8 for files in STAGE_FILES.values())  # the GPU tool's limit


def test_summary_table_then_the_results_come_last_with_every_step(dry) -> None:
    done, out = dry
    assert done.stdout.rstrip().endswith(read(out, "results.md").rstrip())  # the end of stdout
    lines = read(out, "summary.txt").splitlines()
    rows = [r.split(" | ") for r in lines if re.match(r"\| ([123]|recipe) \|", r)]
    steps = {(r[0].strip("| "), r[1]): r[2] for r in rows}
    assert set(steps.values()) <= {"ok", "warn"}, rows  # warn: e.g. no cuda-marked test yet
    for stage, step in [("1", "env"), ("1", "bench_train recipe"), ("1", "bench_train base"),
                        ("1", "bench_train big"), ("1", "bench_train recipe-compiled"),
                        ("1", "bench_train base-compiled"), ("2", "pace: recipe"),
                        ("2", "pace: no progress bar"), ("2", "pace: no validation"),
                        ("2", "pace: validation batches of 4096"), ("2", "pace: compiled"),
                        ("2", "bench_validation"), ("3", "bench_decode reference"),
                        ("3", "bench_decode equal"), ("3", "bench_attention"),
                        ("3", "pytest GPU-relevant files"), ("recipe", "recipe train (call 1)"),
                        ("recipe", "recipe train (call 2)"),
                        *[("recipe", f"evaluate {s}") for s in SPLITS]]:  # fmt: skip
        assert steps.get((stage, step)) == "ok", (stage, step, rows)


def test_results_hold_a_table_for_each_stage(dry) -> None:
    results = read(dry[1], "results.md")
    titles = re.findall(r"^### (.*) \(\d{4}-\d\d-\d\d, `bash bench/gpu_check.sh (\S+)`\)$",
                        results, re.M)  # fmt: skip
    assert [stage for _, stage in titles] == ["1", "2", "3", "recipe"]
    assert "torch 2." in results and "commit " in results  # the machine and the code
    for preset in ("recipe", "base", "big"):  # bench_train: ours and its peer at each size
        assert re.search(rf"^\| {preset} \| ours \| [\d,]+ \| [\d.]+ / [\d.]+ / [\d.]+ \|",
                         results, re.M)  # fmt: skip
        assert re.search(rf"^\| {preset} \| torch\.nn\.Transformer \| .* \| [\d.]+x \|$",
                         results, re.M)  # fmt: skip
    assert re.search(r"^\| recipe-compiled \| ours, compiled \| .* \| [\d.]+x \|$", results, re.M)
    assert re.search(r"^\| recipe \| `-` \| 6 \| [\d.]+ \| [\d.]+ \| - \|", results, re.M)
    assert re.search(r"^Training steps' share of the recipe's fit loop .*: \d+%$", results, re.M)
    assert "| attention maps: the training thread |" in results
    assert "| ours |" in results and "| test_2016_flickr |" in results


def test_env_file_names_the_machine(dry) -> None:
    env = read(dry[1], "env.txt")
    for key in ("python", "torch", "torch_cuda", "cuda_available", "bf16_supported", "lightning",
                "hydra", "datasets", "wandb", "sentencepiece", "sacrebleu",
                "flash_attention_impl"):  # fmt: skip
        assert re.search(rf"^{key}=\S", env, re.M), key
    assert "NOT IMPORTABLE" not in env.split("\ntriton=")[0]  # torch and lightning import
    assert re.search(r"^sdpa_bf16_masked=ok", env, re.M)


def test_tests_are_collected_and_recorded(dry) -> None:
    log = read(dry[1], "tests.log")
    assert "-m cuda" in log and "tests/test_train.py" in log and "--collect-only" in log
    assert re.search(r"\d+ tests collected", log)  # the GPU-relevant files, collected
    suites = ET.parse(dry[1] / "tests.xml").getroot()
    assert suites.tag == "testsuites" and {s.get("name") for s in suites} == {"cuda", "units"}


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
            assert names[:2] == ["ours", "ours, full logits"] and "torch.nn.Transformer" in names
        phases = {s["phase"] for s in run["steps"]}
        assert phases == {"warm", "timed"} and run["options"]["data"]  # Multi30k-named files


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


def test_decoding_file_holds_every_table(dry) -> None:
    bench = read(dry[1], "decode.txt")
    cached = re.findall(r"^\| ours \| [\d.]+ \| [\d.]+ \| \d+ \| - \|$", bench, re.M)
    assert len(cached) == 4  # bench_decode: reference and equal lengths, beam and greedy
    assert "lengths=reference" in bench and "lengths=equal" in bench and "dtype=bfloat16" in bench
    shapes = re.findall(r"^\| (train|decode): .*( \d+\.\d\d ms \|){3} \d+\.\d\dx \|$", bench, re.M)
    assert len(shapes) == 4  # bench_attention


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


class Planted:
    """Unpickling it writes a file: what a checkpoint with pickled code could do on load."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "ran"))


def test_run_info_loads_checkpoints_safely(tmp_path) -> None:
    """gpu_check.py reads last.ckpt as the project does (weights_only: tensors and plain values):
    a checkpoint carrying pickled code is refused, and the code never runs."""
    marker = tmp_path / "ran.txt"
    (tmp_path / "checkpoints").mkdir()
    ckpt = {"state_dict": {}, "hyper_parameters": {"model": {}}, "planted": Planted(marker)}
    torch.save(ckpt, tmp_path / "checkpoints" / "last.ckpt")
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "gpu_check.py"), "run-info", str(tmp_path)],
        capture_output=True, text=True, cwd=REPO,
    )  # fmt: skip
    assert not marker.exists()
    assert done.returncode != 0 and "cannot be read" in done.stderr


def test_run_info_reads_the_precision_lightning_chose(tmp_path) -> None:
    log = tmp_path / "train.log"
    for line, precision in [("Using bfloat16 Automatic Mixed Precision (AMP)", "bf16-mixed"),
                            ("Using 16bit Automatic Mixed Precision (AMP)", "16-mixed"),
                            ("GPU available: False, used: False", "32-true (no AMP)")]:  # fmt: skip
        log.write_text(f"Seed set to 1234\n{line}\n")
        done = subprocess.run(
            [sys.executable, str(REPO / "bench" / "gpu_check.py"), "run-info", str(tmp_path),
             "--log", str(log)], capture_output=True, text=True, check=True,
        )  # fmt: skip
        assert f"precision={precision}\n" in done.stdout and "last_ckpt=missing" in done.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU this would run stage 1 for real")
def test_a_real_run_without_a_gpu_stops_at_once(tmp_path) -> None:
    done = run("1", "--out", str(tmp_path), timeout=120)
    assert done.returncode == 1
    assert "torch sees no CUDA device; on a CPU machine use --dry-run" in done.stdout


def test_bad_arguments_print_the_usage() -> None:
    for args in (["4"], [], ["1", "--fast"]):
        done = run(*args, timeout=30)
        assert done.returncode == 2 and "--dry-run" in done.stderr, args
