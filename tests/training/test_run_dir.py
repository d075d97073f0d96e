"""The run directory of a launch of several processes (transformer/training/run_dir.py): one,
shared by all of them and written by rank 0, however they were started."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from torch.distributed import TCPStore

from tests.tiny import CONFIGS, REPO, script_env, tiny_overrides
from transformer.training import run_dir  # noqa: F401 (registers ${launch_name:...})

pytestmark = pytest.mark.heavy

LAUNCHERS = ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE", "SLURM_STEP_ID")
STAMP = r"\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d\.\d{6}"  # the run directory's time stamp


def run_directory() -> Path:
    """``hydra.run.dir`` as train.py's process would resolve it in this environment."""
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        cfg = compose("train", return_hydra_config=True)
    return Path(cfg.hydra.run.dir)


@pytest.fixture
def launched(monkeypatch):
    """Set the environment of a launcher's process (no launcher's before)."""
    for name in LAUNCHERS:
        monkeypatch.delenv(name, raising=False)

    def setenv(**env: str) -> None:
        for name, value in env.items():
            monkeypatch.setenv(name, value)

    return setenv


def test_the_processes_of_a_torchrun_launch_take_the_first_ones_time_stamp(launched):
    """torchrun starts its processes apart; each asks torchrun's store (here a stand-in, which
    each of them reaches at MASTER_ADDR:MASTER_PORT) and takes the time stamp the first gave."""
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    launched(
        TORCHELASTIC_RUN_ID="none", TORCHELASTIC_USE_AGENT_STORE="True",
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store.port),
    )  # fmt: skip
    first, second = run_directory(), run_directory()  # each a process's own time stamp before
    assert first == second and first.parent == Path("outputs/multi30k_en_de")
    assert re.fullmatch(STAMP, first.name), first


def test_without_torchruns_store_its_run_id_names_the_directory(launched):
    launched(TORCHELASTIC_RUN_ID="3f2a", TORCHELASTIC_USE_AGENT_STORE="False")
    assert run_directory() == Path("outputs/multi30k_en_de/torchrun-3f2a")


def test_the_tasks_of_an_srun_step_share_its_job_and_step(launched):
    """A step of several tasks: slurm-<job>.<step>. A one-task step, or a batch script (no
    step), is its run directory's only process: two of them in one job get a directory each."""
    launched(SLURM_JOB_ID="4711", SLURM_STEP_ID="2", SLURM_STEP_NUM_TASKS="16")
    assert run_directory() == Path("outputs/multi30k_en_de/slurm-4711.2")
    launched(SLURM_STEP_NUM_TASKS="1")
    assert re.fullmatch(STAMP, run_directory().name)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.parametrize("rendezvous", ["standalone", "static"])
def test_torchrun_ranks_share_one_run_directory_that_rank_zero_writes(rendezvous, corpus, tmp_path):
    """Two ranks started at once by torchrun, no hydra.run.dir given: one run directory, holding
    one set of checkpoints, one Hydra record and one log, rank 0's (its lines once). standalone:
    torchrun's own rendezvous; static: --master_addr/--master_port, as on several nodes."""
    launcher = (
        ["--standalone"]
        if rendezvous == "standalone"
        else [
            "--nnodes=1",
            "--node_rank=0",
            "--master_addr=127.0.0.1",
            f"--master_port={free_port()}",
        ]
    )
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", *launcher,
        str(REPO / "train.py"), *tiny_overrides(corpus), "trainer.devices=2",
        "trainer.strategy=ddp", "trainer.max_steps=3", "validation.bleu_sentences=0",
        "~callbacks.best_checkpoint",
    ]  # fmt: skip
    res = subprocess.run(
        cmd, cwd=tmp_path, env=script_env(tmp_path), capture_output=True, text=True, timeout=240
    )
    assert res.returncode == 0, res.stderr[-3000:]
    runs = list((tmp_path / "outputs" / "multi30k_en_de").iterdir())
    assert len(runs) == 1, runs
    (run,) = runs
    assert sorted(p.name for p in run.iterdir()) == [".hydra", "checkpoints", "csv", "train.log"]
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["last.ckpt"]
    assert (run / "train.log").read_text().count("model: ") == 1
