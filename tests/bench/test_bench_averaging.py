"""bench/bench_averaging.py: the windows it averages are the run's last epochs, by count and by
share of the updates, each set of epochs scored once."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench.bench_averaging import windows
from tests.tiny import REPO
from transformer.errors import UserError


def fake_run(tmp_path: Path, epoch_steps: list[int], last_step: int) -> Path:
    """A run directory whose checkpoints hold only what the windows read: the update count."""
    (tmp_path / "checkpoints" / "epochs").mkdir(parents=True)

    def save(path: Path, step: int) -> None:
        torch.save({"state_dict": {}, "hyper_parameters": {"model": {}}, "global_step": step}, path)

    for epoch, step in enumerate(epoch_steps):
        save(tmp_path / "checkpoints" / "epochs" / f"epoch{epoch:03d}-step{step}.ckpt", step)
    save(tmp_path / "checkpoints" / "last.ckpt", last_step)
    return tmp_path


def test_windows_by_epochs_and_by_share_of_the_updates(tmp_path: Path) -> None:
    run = fake_run(tmp_path, [100 * e for e in range(1, 11)], last_step=1050)  # 10 epochs
    epochs = run / "checkpoints" / "epochs"
    by_step = {s: epochs / f"epoch{s // 100 - 1:03d}-step{s}.ckpt" for s in range(100, 1001, 100)}
    got = windows(run, epochs=[1, 5, 10, 20], shares=[0.1, 0.2, 0.5])
    assert got == {
        "last": [run / "checkpoints" / "last.ckpt"],
        "1 epochs = 0.1 of training": [by_step[1000]],  # ended after update 945
        "5 epochs = 0.5 of training": [by_step[s] for s in (600, 700, 800, 900, 1000)],
        "10 epochs": [by_step[s] for s in range(100, 1001, 100)],
        "0.2 of training": [by_step[900], by_step[1000]],  # after update 840
    }  # 20 epochs: the run has 10


def test_epochs_sorted_by_update_not_by_name(tmp_path: Path) -> None:
    run = fake_run(tmp_path, [500, 1000], last_step=1000)
    (run / "checkpoints" / "epochs" / "epoch000-step500.ckpt").rename(
        run / "checkpoints" / "epochs" / "z.ckpt"
    )
    assert windows(run, epochs=[1], shares=[])["1 epochs"][0].name.startswith("epoch001")


def test_a_run_without_epoch_checkpoints_names_the_option(tmp_path: Path) -> None:
    run = fake_run(tmp_path, [], last_step=10)
    with pytest.raises(UserError, match="callbacks.epoch_checkpoints"):
        windows(run, epochs=[10], shares=[])


@pytest.mark.slow
def test_a_damaged_epoch_checkpoint_is_one_error_line(tmp_path: Path) -> None:
    run = fake_run(tmp_path, [100], last_step=100)
    damaged = run / "checkpoints" / "epochs" / "epoch001-step200.ckpt"
    damaged.write_bytes(b"PK\x03\x04 cut short")
    done = subprocess.run([sys.executable, str(REPO / "bench" / "bench_averaging.py"), str(run),
                           "--data", str(tmp_path)], capture_output=True, text=True, cwd=REPO,
                          timeout=300)  # fmt: skip
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1].startswith(f"error: checkpoint {damaged} cannot")
