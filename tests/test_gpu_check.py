"""bench/gpu_check.sh, the checks a session runs when a GPU is lent: its three stages, dry-run on
CPU (tiny model, synthetic corpus, bench scripts at their test sizes), run every command line a
real run uses, and each step leaves what it must (an empty or missing result fails here)."""

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
FILES = {"env.txt", "tests.log", "tests.xml", "smoke.log", "bench.txt", "recipe.log",
         "recipe_metrics.json", "summary.txt"}  # fmt: skip
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


def test_all_stages_exit_0_within_eight_files(dry) -> None:
    done, out = dry
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert {p.name for p in out.iterdir()} == FILES  # the GPU tool brings back at most 8


def test_summary_table_comes_last_with_every_step(dry) -> None:
    done, out = dry
    assert done.stdout.rstrip().endswith("failed")  # the table is the end of stdout
    lines = read(out, "summary.txt").splitlines()
    rows = [r.split(" | ") for r in lines if re.match(r"\| [123] \|", r)]
    steps = {(r[0].strip("| "), r[1]): r[2] for r in rows}
    assert set(steps.values()) <= {"ok", "warn"}, rows  # warn: e.g. no cuda-marked test yet
    for stage, step in [("1", "env"), ("1", "pytest GPU-relevant files"),
                        ("1", "smoke: train.py default"), ("1", "smoke: compile=true"),
                        ("2", "bench_train base bf16"), ("2", "bench_train big --compile"),
                        ("2", "bench_decode reference"), ("2", "bench_attention"),
                        ("3", "recipe train (call 1)"), ("3", "recipe train (call 2)"),
                        *[("3", f"evaluate {s}") for s in SPLITS]]:  # fmt: skip
        assert steps.get((stage, step)) == "ok", (stage, step, rows)


def test_env_file_names_the_machine(dry) -> None:
    env = read(dry[1], "env.txt")
    for key in ("python", "torch", "torch_cuda", "cuda_available", "bf16_supported", "lightning",
                "hydra", "datasets", "wandb", "sentencepiece", "sacrebleu"):  # fmt: skip
        assert re.search(rf"^{key}=\S", env, re.M), key
    assert "NOT IMPORTABLE" not in env.split("\ntriton=")[0]  # torch and lightning import
    assert re.search(r"^sdpa_bf16_masked=ok", env, re.M)


def test_tests_are_collected_and_recorded(dry) -> None:
    log = read(dry[1], "tests.log")
    assert "-m cuda" in log and "tests/test_train.py" in log and "--collect-only" in log
    assert re.search(r"\d+ tests collected", log)  # the GPU-relevant files, collected
    suites = ET.parse(dry[1] / "tests.xml").getroot()
    assert suites.tag == "testsuites" and {s.get("name") for s in suites} == {"cuda", "units"}


def test_smoke_runs_train_and_log(dry) -> None:
    log = read(dry[1], "smoke.log")
    default, compiled = log.split("hydra.run.dir=")[1:]  # the default, then compile=true
    assert "finished at step 4" in default and "global_step=4" in default
    assert "attention_analyses=1" in default and "val_bleu_last=" in default  # validated
    assert "compile=true" in compiled and "data.pad_to_multiple=8" in compiled
    assert "finished at step 2" in compiled and "global_step=2" in compiled
    assert len(re.findall(r"train_loss_first_last=\d+\.\d+ -> \d+\.\d+", log)) == 2


def test_bench_file_holds_every_table(dry) -> None:
    bench = read(dry[1], "bench.txt")
    ours = re.findall(r"^\| ours \| [\d.]+M \| [\d,]+ \|", bench, re.M)
    assert len(ours) == 4  # bench_train: two sizes (tiny here), eager and --compile
    assert len(re.findall(r"^\$ .*bench_train\.py .*--compile", bench, re.M)) == 2
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
