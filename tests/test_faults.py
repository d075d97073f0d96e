"""Fault injection: interrupted checkpoint writes, kills and signals, NaN losses, bad input.

The README's "What happens when..." section points here; each test states one guarantee.
"""

from __future__ import annotations

import errno
import gzip
import hashlib
import json
import logging
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from tests.tiny import (
    REPO,
    compose_cfg,
    compose_eval_cfg,
    heap_held_by_new_shapes,
    logged,
    tiny_overrides,
    write_lines,
)
from transformer import atomic
from transformer.atomic import HOST
from transformer.averaging import average_checkpoints
from transformer.averaging import main as average_main
from transformer.checkpoints import load_checkpoint
from transformer.configs import CONFIG_DIR
from transformer.data.tokenizer import Tokenizer
from transformer.errors import CheckpointError, ConfigError, DataError, NonFiniteLoss, UserError
from transformer.evaluation import evaluate
from transformer.export.ct2 import export_ct2
from transformer.linear import ONEDNN
from transformer.prune import main as prune_main
from transformer.training import lit_module, run_dir, train
from transformer.training.callbacks import AtomicCheckpointIO

pytestmark = pytest.mark.heavy


def fail_mid_write(monkeypatch) -> None:
    """Make the next checkpoint write put out half its bytes, then fail (a full disk, a kill)."""

    def partial_save(obj, f) -> None:
        f.write(b"PK\x03\x04 half a checkpoint")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic.torch, "save", partial_save)


# -- interrupted checkpoint writes ----------------------------------------------------------------


def test_interrupted_write_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "last.ckpt"
    io = AtomicCheckpointIO()
    io.save_checkpoint({"step": 1, "w": torch.ones(3)}, path)
    fail_mid_write(monkeypatch)
    with pytest.raises(CheckpointError, match=r"could not write checkpoint .*last.ckpt \(No space"):
        io.save_checkpoint({"step": 2, "w": torch.zeros(3)}, path)
    monkeypatch.undo()
    assert torch.load(path, weights_only=True)["step"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]  # no temporary file left


@pytest.mark.slow
def test_training_crash_during_a_checkpoint_write_keeps_the_last_one(corpus, tmp_path, monkeypatch):
    """The Trainer writes through the atomic plugin: a save that dies at step 4 leaves step 2's."""
    save = AtomicCheckpointIO.save_checkpoint

    def save_then_fail_at_step_4(self, checkpoint, path, storage_options=None):
        if checkpoint["global_step"] == 4:
            fail_mid_write(monkeypatch)
        save(self, checkpoint, path, storage_options)

    monkeypatch.setattr(AtomicCheckpointIO, "save_checkpoint", save_then_fail_at_step_4)
    overrides = [
        *tiny_overrides(corpus),
        "trainer.max_steps=6",
        "callbacks.last_checkpoint.every_n_train_steps=2",
    ]
    with pytest.raises(CheckpointError, match=r"last.ckpt \(No space left on device\)"):
        train(compose_cfg(overrides, tmp_path))
    ckpt = load_checkpoint(tmp_path / "checkpoints" / "last.ckpt")
    assert ckpt["global_step"] == 2
    files = [p.name for p in (tmp_path / "checkpoints").rglob("*") if p.is_file()]
    assert files == ["last.ckpt"]  # no temporary file left (epochs/ is the epoch checkpoints')


# -- kills and signals ----------------------------------------------------------------------------


def start_train_py(corpus: Path, run_dir: Path, *overrides: str) -> subprocess.Popen:
    """train.py in a subprocess, each step slowed to 0.1 s, recording the ids of every batch."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    cmd = [
        sys.executable, "train.py", *tiny_overrides(corpus), f"hydra.run.dir={run_dir}",
        "+callbacks.slow._target_=tests.fault_kit.SlowSteps", "+callbacks.slow.seconds=0.1",
        "+callbacks.batch_ids._target_=tests.fault_kit.BatchIdRecorder",
        f"+callbacks.batch_ids.out_dir={run_dir / 'ids'}", *overrides,
    ]  # fmt: skip
    return subprocess.Popen(cmd, cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)


def wait_for(proc: subprocess.Popen, run_dir: Path, batches: int, checkpoint: bool) -> None:
    """Until the run has trained ``batches`` batches (and written last.ckpt, if asked)."""
    ids, ckpt = run_dir / "ids" / "batch_ids.rank0.jsonl", run_dir / "checkpoints" / "last.ckpt"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        done = ids.is_file() and len(ids.read_text().splitlines()) >= batches
        if done and (ckpt.is_file() or not checkpoint):
            return
        time.sleep(0.05)
    proc.kill()
    pytest.fail(f"the run did not reach {batches} batches in time")


def final_loss(out_dir: Path) -> float:
    return logged(out_dir, "train/loss")[-1]


@pytest.mark.slow
def test_sigkill_then_resume_matches_an_uninterrupted_run(corpus, tmp_path):
    """Killed mid-epoch between two periodic checkpoints, resumed from last.ckpt: the same final
    weights and loss as a run never interrupted (10 steps of a 16-batch epoch, dropout on)."""
    common = [*tiny_overrides(corpus), "model.dropout=0.1", "trainer.max_steps=10"]
    every = "callbacks.last_checkpoint.every_n_train_steps=3"
    killed = tmp_path / "killed"
    proc = start_train_py(corpus, killed, "model.dropout=0.1", "trainer.max_steps=10", every)
    wait_for(proc, killed, batches=5, checkpoint=True)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    last = killed / "checkpoints" / "last.ckpt"
    step = load_checkpoint(last)["global_step"]
    assert step in (3, 6, 9)
    train(compose_cfg([*common, every, f"ckpt_path={last}"], tmp_path / "resumed"))
    train(compose_cfg([*common, every], tmp_path / "whole"))
    want = weights(tmp_path / "whole" / "checkpoints" / "last.ckpt")
    got = weights(tmp_path / "resumed" / "checkpoints" / "last.ckpt")
    for key, value in want.items():
        torch.testing.assert_close(got[key], value, rtol=0, atol=1e-4)
    assert final_loss(tmp_path / "resumed") == pytest.approx(
        final_loss(tmp_path / "whole"), abs=1e-4
    )


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_sigterm_or_ctrl_c_writes_a_checkpoint_before_exiting(corpus, tmp_path, signum):
    run = tmp_path / "run"  # no periodic checkpoint: only the signal makes one
    proc = start_train_py(corpus, run, "trainer.max_steps=200")
    wait_for(proc, run, batches=3, checkpoint=False)
    proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert "Traceback" not in stderr
    last_line = stderr.strip().splitlines()[-1]
    name = signal.Signals(signum).name
    assert re.fullmatch(
        rf"error: {name} at step (\d+): training stopped; .*resume with .*", last_line
    )
    step = int(re.search(r"at step (\d+)", last_line)[1])
    assert 3 <= step < 200
    assert load_checkpoint(run / "checkpoints" / "last.ckpt")["global_step"] == step


@pytest.mark.slow
def test_sigterm_before_training_starts_still_writes_a_checkpoint(corpus, tmp_path):
    """Lightning's own SIGTERM handling (active during the sanity check) would exit 0 without a
    checkpoint after the first step; the run stops as for a SIGTERM during training."""
    run, started = tmp_path / "run", tmp_path / "sanity-check-started"
    proc = start_train_py(
        corpus, run, "trainer.max_steps=200", "trainer.num_sanity_val_steps=1",
        "+callbacks.pause._target_=tests.fault_kit.PauseInSanityCheck",
        "+callbacks.pause.seconds=2", f"+callbacks.pause.marker={started}",
    )  # fmt: skip
    deadline = time.monotonic() + 90
    while not started.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=90)
    assert proc.returncode == 1, stderr[-3000:]
    assert "error: SIGTERM at step 1: training stopped" in stderr
    assert load_checkpoint(run / "checkpoints" / "last.ckpt")["global_step"] == 1


# -- determinism ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_same_seed_gives_identical_losses(corpus, tmp_path):
    overrides = [*tiny_overrides(corpus), "model.dropout=0.1", "trainer.max_steps=6"]
    train(compose_cfg(overrides, tmp_path / "a"))
    train(compose_cfg(overrides, tmp_path / "b"))
    losses = [logged(tmp_path / run, "train/loss") for run in ("a", "b")]
    assert len(losses[0]) == 6 and losses[0] == losses[1]
    train(compose_cfg([*overrides, "seed=7"], tmp_path / "c"))
    other = logged(tmp_path / "c", "train/loss")
    assert other != losses[0]  # the seed matters: the comparison above can fail


# -- NaN and inf losses -------------------------------------------------------------------------


def poison(monkeypatch, bad_batches: set[int], make_bad) -> None:
    """``make_bad(loss, n)`` replaces the loss of the given training batches (counted from 0,
    across runs of this test)."""
    real = lit_module.label_smoothed_loss
    seen = {"n": 0}

    def loss(*args, **kwargs):
        out = real(*args, **kwargs)
        if not torch.is_grad_enabled():  # validation
            return out
        n, seen["n"] = seen["n"], seen["n"] + 1
        return (make_bad(out[0], n), *out[1:]) if n in bad_batches else out

    monkeypatch.setattr(lit_module, "label_smoothed_loss", loss)


def poison_loss(monkeypatch, bad_batches: set[int]) -> None:
    """The loss of the given batches is NaN (odd ones) or inf (even ones)."""
    poison(monkeypatch, bad_batches, lambda loss, n: loss * float("nan" if n % 2 else "inf"))


class NonFiniteGradient(torch.autograd.Function):
    """The identity forward; backward gives NaN (odd ``n``) or inf gradients."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, n: int) -> torch.Tensor:
        ctx.bad = float("nan") if n % 2 else float("inf")
        return x.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad * ctx.bad, None


def poison_gradients(monkeypatch, bad_batches: set[int]) -> None:
    """The given batches keep a finite loss, but their gradients are NaN or inf."""
    poison(monkeypatch, bad_batches, NonFiniteGradient.apply)


def weights(path: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(path)["state_dict"]


# Two ways to skip: a plain optimizer drops the gradients, decided on the host each step; fused
# AdamW (the default on CUDA) skips in its kernel, and the flags are counted lazily, here only
# every 5th step and before each checkpoint.
SKIP_PATHS = {"host": [], "fused": ["optim.optimizer.fused=true", "trainer.log_every_n_steps=5"]}


@pytest.mark.slow
@pytest.mark.parametrize("path", SKIP_PATHS)
def test_nan_and_inf_steps_are_skipped_and_counted(corpus, tmp_path, monkeypatch, path):
    poison_loss(monkeypatch, {3, 4})
    overrides = [*tiny_overrides(corpus), "trainer.max_steps=8", "loss.max_bad_steps=3"]
    metrics = train(compose_cfg([*overrides, *SKIP_PATHS[path]], tmp_path))
    assert metrics["train/skipped_steps"] == 2
    ckpt = load_checkpoint(tmp_path / "checkpoints" / "last.ckpt")
    assert ckpt["skipped_steps"] == 2
    assert all(torch.isfinite(w).all() for w in ckpt["state_dict"].values())
    adam_steps = {float(s["step"]) for s in ckpt["optimizer_states"][0]["state"].values()}
    assert adam_steps == {6.0}  # 8 steps, 2 of them made no update


@pytest.mark.slow
@pytest.mark.parametrize("clip", ["1.0", "null"], ids=["clip", "no-clip"])
@pytest.mark.parametrize("path", SKIP_PATHS)
def test_nan_or_inf_gradients_with_a_finite_loss_are_skipped(
    corpus, tmp_path, monkeypatch, path, clip
):
    poison_gradients(monkeypatch, {3, 4})
    overrides = [
        *tiny_overrides(corpus),
        "trainer.max_steps=8",
        f"trainer.gradient_clip_val={clip}",
    ]
    metrics = train(compose_cfg([*overrides, *SKIP_PATHS[path]], tmp_path))
    assert metrics["train/skipped_steps"] == 2 and math.isfinite(metrics["train/loss"])
    ckpt = load_checkpoint(tmp_path / "checkpoints" / "last.ckpt")
    assert all(torch.isfinite(w).all() for w in ckpt["state_dict"].values())
    states = ckpt["optimizer_states"][0]["state"].values()
    assert all(torch.isfinite(s["exp_avg_sq"]).all() for s in states)
    assert {float(s["step"]) for s in states} == {6.0}  # 8 steps, 2 of them made no update


@pytest.mark.slow
@pytest.mark.parametrize("path", SKIP_PATHS)
def test_skipped_steps_do_not_advance_the_learning_rate_schedule(
    corpus, tmp_path, monkeypatch, path
):
    """The schedule counts updates made: 8 steps with 2 skipped leave it at update 6 (the host
    path holds the rate at each skipped step), and a run resumed after the skips ends with the
    weights and optimizer state of the uninterrupted one."""
    overrides = [*tiny_overrides(corpus), "loss.max_bad_steps=3", *SKIP_PATHS[path]]
    poison_loss(monkeypatch, {3, 4})
    train(compose_cfg([*overrides, "trainer.max_steps=8"], tmp_path / "full"))
    full = load_checkpoint(tmp_path / "full" / "checkpoints" / "last.ckpt")
    assert full["lr_schedulers"][0]["last_epoch"] == 6
    peak, warmup = 3e-3, 10  # tiny_overrides' rate and warmup: linear warmup for 10 updates
    assert full["optimizer_states"][0]["param_groups"][0]["lr"] == pytest.approx(peak * 7 / warmup)
    if path == "host":  # the rate of each step, as logged before its update
        want = [peak * (u + 1) / warmup for u in [0, 1, 2, 3, 3, 3, 4, 5]]
        assert logged(tmp_path / "full", "lr") == pytest.approx(want)

    poison_loss(monkeypatch, {3, 4})  # counted from 0 again
    train(compose_cfg([*overrides, "trainer.max_steps=6"], tmp_path / "part"))
    part = tmp_path / "part" / "checkpoints" / "last.ckpt"
    resumed = tmp_path / "resumed"
    train(compose_cfg([*overrides, "trainer.max_steps=8", f"ckpt_path={part}"], resumed))
    got = load_checkpoint(resumed / "checkpoints" / "last.ckpt")
    assert got["lr_schedulers"][0]["last_epoch"] == 6
    for key, value in got["state_dict"].items():
        torch.testing.assert_close(value, full["state_dict"][key], rtol=0, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("path", SKIP_PATHS)
def test_nan_loss_in_a_row_stops_naming_the_step_and_keeps_the_last_good_checkpoint(
    corpus, tmp_path, monkeypatch, path
):
    overrides = [
        *tiny_overrides(corpus),
        "trainer.max_steps=20",
        "loss.max_bad_steps=3",
        "callbacks.last_checkpoint.every_n_train_steps=2",
        *SKIP_PATHS[path],
    ]
    good = train(compose_cfg([*overrides, "trainer.max_steps=4"], tmp_path / "good"))
    assert good["train/loss"] > 0
    poison_loss(monkeypatch, set(range(4, 100)))  # every batch from the 5th on
    with pytest.raises(NonFiniteLoss, match=r"3 steps in a row, the last at step 6"):
        train(compose_cfg(overrides, tmp_path / "bad"))
    last = tmp_path / "bad" / "checkpoints" / "last.ckpt"
    assert load_checkpoint(last)["global_step"] == 4  # written before the first NaN
    expected = weights(tmp_path / "good" / "checkpoints" / "last.ckpt")
    for key, value in weights(last).items():
        torch.testing.assert_close(value, expected[key], rtol=0, atol=0)


@pytest.mark.slow
def test_nan_on_one_ddp_rank_skips_the_step_on_every_rank(corpus, tmp_path):
    """Two CPU processes, the loss NaN on rank 0 only: both skip (no hang in the all-reduce).
    With the GPU defaults: bf16-mixed, fused AdamW skipping in its kernel, clipping."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    cmd = [
        sys.executable, "train.py", *tiny_overrides(corpus), f"hydra.run.dir={tmp_path}",
        "trainer.devices=2", "trainer.strategy=ddp", "trainer.max_steps=4",
        "trainer.precision=bf16-mixed", "optim.optimizer.fused=true",
        "trainer.gradient_clip_val=1.0",
        "+callbacks.poison._target_=tests.fault_kit.PoisonLoss", "+callbacks.poison.rank=0",
        "+callbacks.poison.batches=[1]",
    ]  # fmt: skip
    res = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stderr[-3000:]
    ckpt = load_checkpoint(tmp_path / "checkpoints" / "last.ckpt")
    assert ckpt["global_step"] == 4 and ckpt["skipped_steps"] == 1
    assert all(torch.isfinite(w).all() for w in ckpt["state_dict"].values())


@pytest.mark.slow
def test_ddp_resume_gives_each_rank_its_own_random_state(corpus, tmp_path):
    """Two CPU processes with dropout: 6 steps in one run == 3 steps, checkpoint, resume to 6.
    The ranks' dropout streams differ (their batches do), so each rank needs its own back."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    common = [*tiny_overrides(corpus), "trainer.devices=2", "trainer.strategy=ddp"]
    common += ["model.dropout=0.1", "model.attention_dropout=0.1"]

    def run(out: Path, *extra: str) -> None:
        cmd = [sys.executable, "train.py", *common, f"hydra.run.dir={out}", *extra]
        res = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr[-3000:]

    run(tmp_path / "full", "trainer.max_steps=6")
    run(tmp_path / "part", "trainer.max_steps=3")
    part = tmp_path / "part" / "checkpoints" / "last.ckpt"
    assert len(load_checkpoint(part)["rng_states"]) == 2
    run(tmp_path / "resumed", "trainer.max_steps=6", f"ckpt_path={part}")
    want = weights(tmp_path / "full" / "checkpoints" / "last.ckpt")
    for key, value in weights(tmp_path / "resumed" / "checkpoints" / "last.ckpt").items():
        torch.testing.assert_close(value, want[key], rtol=0, atol=1e-6)


# -- bad input ----------------------------------------------------------------------------------
# Each is a user error: train() raises a UserError (train.py prints it as one `error:` line
# and exits 1) before any checkpoint is written. Tested elsewhere: invalid UTF-8, mismatched line
# counts and an all-empty file at the data level (tests/data/test_data_sources.py,
# test_data_datamodule.py), over-long training lines dropped and counted
# (test_empty_and_overlong_training_pairs_are_dropped), wandb without key or network
# (tests/training/test_train.py).


@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory) -> Path:
    """A run of 17 steps on the tiny corpus: ``checkpoints/last.ckpt`` and the weights-only
    epoch checkpoint ``checkpoints/epochs/epoch000-step16.ckpt`` (16 batches an epoch)."""
    run = tmp_path_factory.mktemp("trained")
    train(compose_cfg([*tiny_overrides(corpus), "trainer.max_steps=17"], run))
    return run


def _corrupt(root: Path, case: str, request: pytest.FixtureRequest) -> list[str]:
    """Damage a copy of the tiny corpus in ``root`` (or the run: ``request`` gives the
    ``monkeypatch`` and ``trained`` fixtures); return the extra overrides the case needs."""
    if case in RESUMED:
        shutil.copy(request.getfixturevalue("trained") / "checkpoints" / "last.ckpt", root)
        return [f"ckpt_path={root / 'last.ckpt'}", *_corrupt_resumed(root, case, request)]
    if case == "mismatched line counts":
        lines = (root / "train.de").read_text(encoding="utf-8").splitlines()
        (root / "train.de").write_text("\n".join(lines[:-3]) + "\n", encoding="utf-8")
    elif case == "an empty file":
        (root / "train.en").write_bytes(b"")
        (root / "train.de").write_bytes(b"")
    elif case == "a file of empty lines":
        (root / "train.en").write_text("\n" * 400, encoding="utf-8")
    elif case == "invalid UTF-8":
        with open(root / "val.de", "ab") as f:
            f.write("groß\n".encode("latin-1"))
    elif case == "lines over the maximum length":
        return ["data.max_len=1"]  # every training pair is longer: nothing left to train on
    elif case == "data.max_len beyond model.max_positions":
        return ["data.max_len=300", "data.max_tokens=1024"]
    elif case == "a language the dataset lacks":
        return ["data.tgt_lang=fr"]
    elif case == "a data.root that does not exist":
        return [f"data.root={root / 'nowhere'}"]
    elif case == "heads not dividing d_model":
        return ["model.num_heads=3"]
    elif case == "kv heads not dividing heads":
        return ["model.num_heads=4", "model.num_kv_heads=3"]
    elif case == "an unwritable output directory":
        (root / "a-file").write_text("")
        return [f"callbacks.last_checkpoint.dirpath={root / 'a-file' / 'checkpoints'}"]
    elif case == "a validation line beyond model.max_positions":
        for lang in ("en", "de"):  # pair 33 of val: 300 words, 300+ pieces
            with open(root / f"val.{lang}", "a", encoding="utf-8") as f:
                f.write(" ".join(["a" if lang == "en" else "ein"] * 300) + "\n")
    elif case == "a truncated checkpoint to resume from":
        (root / "last.ckpt").write_bytes(b"PK\x03\x04 cut short")
        return [f"ckpt_path={root / 'last.ckpt'}"]
    # issue 51: the faults below each gave a traceback or a misleading line
    elif case == "a truncated .gz training file":
        _gzip_all(root)
        data = (root / "train.de.gz").read_bytes()
        (root / "train.de.gz").write_bytes(data[: len(data) // 2])
    elif case == "a .gz validation file that is not gzip":
        _gzip_all(root)
        (root / "val.en.gz").write_bytes(b"plain\n" * 32)
    elif case == "a validation pair longer than data.max_tokens":
        for lang, word in (("en", "a"), ("de", "ein")):  # pair 33 of val: 150 pieces a side
            with open(root / f"val.{lang}", "a", encoding="utf-8") as f:
                f.write(" ".join([word] * 150) + "\n")
        return ["data.max_tokens=140"]
    elif case == "a full disk while the tokenizer is written":
        full_disk(request.getfixturevalue("monkeypatch"), ".model")
    elif case == "a full disk while a checkpoint is written":
        fail_mid_write(request.getfixturevalue("monkeypatch"))
    elif case in WRONG_TYPES or case == "data.num_workers=-1":
        return [case]
    return []


def _corrupt_resumed(root: Path, case: str, request: pytest.FixtureRequest) -> list[str]:
    """A resume from ``root/last.ckpt`` (the ``trained`` run's), damaged as ``case`` says."""
    trained = request.getfixturevalue("trained") / "checkpoints"
    if case == "resume, a .gz training file that is not gzip":
        _gzip_all(root)
        (root / "train.en.gz").write_bytes(b"plain text\n" * 400)
    elif case == "resume from a weights-only epoch checkpoint":
        return [f"ckpt_path={trained / 'epochs' / 'epoch000-step16.ckpt'}"]
    elif case == "resume from an averaged checkpoint":
        averaged = average_checkpoints(
            [trained / "last.ckpt", trained / "epochs" / "epoch000-step16.ckpt"]
        )
        atomic.atomic_save(averaged, root / "averaged.ckpt")
        return [f"ckpt_path={root / 'averaged.ckpt'}"]
    elif case == "resume from a checkpoint whose tokenizer bytes are damaged":
        ckpt = torch.load(root / "last.ckpt", weights_only=True)
        model = ckpt["tokenizers"]["src"]["model"]
        ckpt["tokenizers"]["src"]["model"] = model[:100] + b"\xff" * 64 + model[164:]
        torch.save(ckpt, root / "last.ckpt")
    return RESUMED[case]


def _gzip_all(root: Path) -> None:
    """The corpus's files gzipped (``train.en`` -> ``train.en.gz``)."""
    for path in [p for p in root.iterdir() if p.suffix in (".en", ".de")]:
        with gzip.open(path.with_name(path.name + ".gz"), "wb") as f:
            f.write(path.read_bytes())
        path.unlink()


def full_disk(monkeypatch, name_part: str) -> None:
    """The disk fills up while a file whose (temporary) name holds ``name_part`` is written
    through :mod:`transformer.atomic`: half its bytes land, then ENOSPC."""
    real_open = open

    class HalfWritten:
        def __init__(self, f) -> None:
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc) -> None:
            self.f.close()

        def __getattr__(self, name: str):
            return getattr(self.f, name)

        def write(self, data: bytes) -> int:
            self.f.write(data[: len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")

    def opener(path, mode="r", *args, **kwargs):
        f = real_open(path, mode, *args, **kwargs)
        return HalfWritten(f) if name_part in Path(path).name else f

    monkeypatch.setattr(atomic, "open", opener, raising=False)


RESUMED = {  # a resume from the trained run's last.ckpt -> the overrides it adds
    "resume, a .gz training file that is not gzip": [],
    "resume with another model width": ["model.d_model=32"],
    "resume with another depth": ["model.num_decoder_layers=3"],
    "resume from a weights-only epoch checkpoint": [],
    "resume from an averaged checkpoint": [],
    "resume with the languages swapped": ["data.src_lang=de", "data.tgt_lang=en"],
    "resume with separate vocabularies": ["data.joint_vocab=false"],
    "resume with another corpus": ["data.source=multi30k"],
    "resume from a checkpoint whose tokenizer bytes are damaged": [],
}
WRONG_TYPES = (
    "model.d_model=abc",
    "optim.optimizer.lr=abc",
    "data.max_len=abc",
    "model.num_encoder_layers=2.5",
    "data.joint_vocab=maybe",
)


BAD_TRAINING_INPUT = {
    "mismatched line counts": r"train.en has 400 lines.*train.de has 397",
    "an empty file": r"train.en \+ .*train.de: split 'train' is empty",
    "a file of empty lines": r"every en line of split 'train' is empty",
    "invalid UTF-8": r"val.de, line 33: bytes that are not UTF-8",
    "lines over the maximum length": r"max_len=1 filter removed",
    "data.max_len beyond model.max_positions": r"data.max_len=300 .* model.max_positions=256",
    "a language the dataset lacks": r"expected train.en and train.fr",
    "a data.root that does not exist": r"data.root=.*nowhere does not exist",
    "heads not dividing d_model": r"model\.\*.*num_heads=3 does not divide d_model",
    "kv heads not dividing heads": r"num_kv_heads=3 does not divide num_heads=4",
    "an unwritable output directory": r"callbacks.last_checkpoint.dirpath=.*not a writable",
    "a truncated checkpoint to resume from": r"last.ckpt is truncated or not a checkpoint",
    "a validation line beyond model.max_positions": r"val: 1 sentence pair\(s\) longer than "
    r"model.max_positions=256 .*first: pair 33",
    # issue 51
    "a truncated .gz training file": r"train.de.gz: its gzip data is truncated or damaged "
    r"\(Compressed file ended before the end-of-stream marker was reached\); copy or download",
    "a .gz validation file that is not gzip": r"val.en.gz is not a gzip file .*compress it",
    "resume, a .gz training file that is not gzip": r"train.en.gz is not a gzip file",
    "resume with another model width": r"last.ckpt holds a model with model.d_model=64, but this "
    r"run's has model.d_model=32; resume with model.d_model=64, or start a new run",
    "resume with another depth": r"model.num_decoder_layers=2, but .* resume with "
    r"model.num_decoder_layers=2,",
    "resume from a weights-only epoch checkpoint": r"epoch000-step16.ckpt holds weights only "
    r"\(an epoch checkpoint\), no optimizer .*resume from .*checkpoints/last.ckpt, or evaluate",
    "resume from an averaged checkpoint": r"averaged.ckpt is an average of 2 checkpoints: "
    r"weights only.*evaluate it",
    "resume with the languages swapped": r"was trained with data.src_lang=en data.tgt_lang=de, "
    r"but this run has data.src_lang=de data.tgt_lang=en; resume with data.src_lang=en "
    r"data.tgt_lang=de",
    "resume with separate vocabularies": r"trained with data.joint_vocab=true, but this run has "
    r"data.joint_vocab=false",
    "resume with another corpus": r"trained with data.source=local, but this run has "
    r"data.source=multi30k",
    "resume from a checkpoint whose tokenizer bytes are damaged": r"last.ckpt: its source "
    r"tokenizer is damaged .*resume from another checkpoint",
    "a validation pair longer than data.max_tokens": r"val: 1 sentence pair\(s\) longer than "
    r"data.max_tokens=140, .*first: pair 33 .*151 tokens.*raise data.max_tokens to at least 151",
    "a full disk while the tokenizer is written": r"could not write the tokenizer model .*\.model "
    r"\(No space left on device\); free space there or set data.cache_dir",
    "a full disk while a checkpoint is written": r"could not write checkpoint .*last.ckpt \(No "
    r"space left on device\)",
    "model.d_model=abc": r"^model.d_model=abc: expected an integer, e.g. model.d_model=512$",
    "optim.optimizer.lr=abc": r"^optim.optimizer.lr=abc: expected a number",
    "data.max_len=abc": r"^data.max_len=abc: expected an integer",
    "model.num_encoder_layers=2.5": r"^model.num_encoder_layers=2.5: expected an integer",
    "data.joint_vocab=maybe": r"^data.joint_vocab=maybe: expected true or false",
    # issue 68
    "data.num_workers=-1": r"^invalid data option \(data\.\*\): data\.num_workers=-1: give the "
    r"number of loader processes, 0 or more",
}


def checksums(root: Path) -> dict[str, str]:
    """Each of the user's files under ``root`` (not the data cache: the run's) -> its content's
    SHA-256 (a link -> its target's name)."""
    files = [p for p in sorted(root.rglob("*")) if p.is_file() or p.is_symlink()]
    return {
        str(p.relative_to(root)): os.readlink(p) if p.is_symlink()
        else hashlib.sha256(p.read_bytes()).hexdigest()
        for p in files if "cache" not in p.relative_to(root).parts
    }  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("case", BAD_TRAINING_INPUT)
def test_bad_training_input_is_a_user_error_naming_the_fault(case, corpus, tmp_path, request):
    """One line (train.py prints it after ``error:``), no checkpoint, the user's files as they
    were, and no temporary file left anywhere."""
    root = tmp_path / "corpus"
    shutil.copytree(corpus, root, ignore=shutil.ignore_patterns("cache"))
    extra = _corrupt(root, case, request)
    before = checksums(root)
    overrides = [*tiny_overrides(root), "trainer.max_steps=2", *extra]
    with pytest.raises(UserError, match=BAD_TRAINING_INPUT[case]) as raised:
        train(compose_cfg(overrides, tmp_path / "run"))
    assert "\n" not in str(raised.value)
    assert checksums(root) == before
    assert not list(tmp_path.glob("run/**/*.ckpt"))
    assert not [p for p in tmp_path.rglob("*") if ".tmp" in p.name]


@pytest.mark.slow
def test_train_py_reports_a_user_error_in_one_line(tmp_path):
    (tmp_path / "a-file").write_text("")
    cmd = [
        sys.executable, "train.py", "model=tiny", "data=local", f"data.root={tmp_path}",
        "logger=csv", f"hydra.run.dir={tmp_path / 'run'}",
        f"paths.output_dir={tmp_path / 'a-file' / 'out'}",
    ]  # fmt: skip
    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 1
    assert res.stderr.strip().splitlines()[-1] == (
        f"error: paths.output_dir={tmp_path / 'a-file' / 'out'} is not a writable directory "
        "(Not a directory); choose another, e.g. hydra.run.dir=DIR"
    )
    assert "Traceback" not in res.stderr


@pytest.mark.slow
def test_a_run_directory_that_cannot_be_made_is_one_error_line(tmp_path):
    (tmp_path / "a-file").write_text("")
    run = tmp_path / "a-file" / "run"
    cmd = [sys.executable, "train.py", "model=tiny", "logger=csv", f"hydra.run.dir={run}"]
    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines()[-1] == (
        f"error: hydra.run.dir={run} cannot be made or opened (Not a directory); choose another "
        "directory"
    )


def test_missing_or_unreadable_tokenizer_model_is_named(tmp_path):
    with pytest.raises(DataError, match=r"tokenizer model .*none.model does not exist"):
        Tokenizer(tmp_path / "none.model")
    (tmp_path / "bad.model").write_bytes(b"not a sentencepiece model")
    with pytest.raises(DataError, match=r"bad.model cannot be read.*delete it"):
        Tokenizer(tmp_path / "bad.model")


# -- where results are written: never over the inputs, over earlier results only when forced ----
# Each command that writes refuses, before writing anything, to replace its own input or an
# earlier result (without --force, or force=true for train.py and evaluate.py): one `error:`
# line, and every file of the user's is byte for byte as it was.


@pytest.fixture(scope="module")
def workspace(corpus, tmp_path_factory) -> Path:
    """A user's folder: a training run (run/: .hydra/, checkpoints/last.ckpt and three epoch
    checkpoints), its export (model/), the corpus it was trained on (corpus/), a folder of notes,
    texts to translate (a link to one of them) with their prefixes and constraints, and an output
    of 5 lines."""
    root = tmp_path_factory.mktemp("user")
    train(compose_cfg([*tiny_overrides(corpus), "trainer.max_steps=2"], root / "run"))
    ckpts = root / "run" / "checkpoints"
    (ckpts / "epochs").mkdir()
    for epoch in (1, 2, 3):
        shutil.copy(ckpts / "last.ckpt", ckpts / "epochs" / f"epoch={epoch}.ckpt")
    (root / "run" / ".hydra").mkdir()
    (root / "run" / ".hydra" / "overrides.yaml").write_text("- seed=1\n")
    (root / "notes").mkdir()
    (root / "notes" / "todo.txt").write_text("average epochs 1-3\n")
    (root / "s.txt").write_text("a dog runs\nthe man sits\n\na cat\n")
    (root / "p.txt").write_text("ein\nder\n\neine\n")  # s.txt's prefixes, and constraints:
    (root / "c.txt").write_text('["Hund"]\n[]\n[]\n["Katze"]\n')
    export_ct2([root / "run" / "checkpoints" / "last.ckpt"], root / "model")
    shutil.copytree(corpus, root / "corpus", ignore=shutil.ignore_patterns("cache"))
    (root / "link.txt").symlink_to("s.txt")
    write_lines(root / "two.txt.gz", ["a dog", "a cat"])
    (root / "out5.txt").write_text("ein\nzwei\ndrei\nvier\nfünf\n")
    return root


CKPT = "run/checkpoints/last.ckpt"
EPOCHS = [f"run/checkpoints/epochs/epoch={e}.ckpt" for e in (1, 2, 3)]
EXPORT = ("-m", "transformer.export", "ct2")
AVERAGE = ("-m", "transformer.checkpoints")
PRUNE = ("-m", "transformer.prune")
EVALUATE = ("evaluate.py", f"ckpt_path={CKPT}", "decode=greedy")

# case -> (the command, run in the user's folder; the `error:` line it ends with)
OVERWRITES = {
    "export --force into the working directory": (
        [*EXPORT, CKPT, ".", "--force"],
        r"error: OUT_DIR \. is the working directory or one above it, .*give OUT_DIR a new "
        r"directory, e\.g\. model",
    ),
    "export --force into the run directory holding the checkpoint": (
        [*EXPORT, CKPT, "run", "--force"],
        rf"error: OUT_DIR run holds the input {CKPT}, which replacing it would delete; .*",
    ),
    "export --force into a folder no export wrote": (
        [*EXPORT, CKPT, "notes", "--force"],
        r"error: OUT_DIR notes is not one this command wrote \(it has no transformer_nmt\.json\)"
        r"; --force replaces only those: give OUT_DIR a new directory",
    ),
    "averaging with its output argument forgotten (epochs/*.ckpt)": (
        [*AVERAGE, *EPOCHS],
        rf"error: output {EPOCHS[0]} exists; give a new path, or --force to replace it \(the "
        r"first argument is the file written, .*\)",
    ),
    "averaging --force onto one of its inputs": (
        [*AVERAGE, EPOCHS[1], *EPOCHS, "--force"],
        rf"error: output {EPOCHS[1]} is the input {EPOCHS[1]}: .*give output a new path",
    ),
    "pruning --force onto its input": (
        [*PRUNE, CKPT, CKPT, "--heads", "cross:0:0", "--force"],
        rf"error: OUT {CKPT} is the input {CKPT}: writing it would destroy what it is made from; "
        "give OUT a new path",
    ),
    "evaluate.py output= its input=": (
        [*EVALUATE, "input=s.txt", "output=s.txt"],
        r"error: output=s.txt is s.txt, an input of this run, which writing it would destroy; "
        r"give output= a new file",
    ),
    "evaluate.py output= a link to its input=": (
        [*EVALUATE, "input=s.txt", "output=link.txt"],
        r"error: output=link.txt is s.txt, an input of this run, .*",
    ),
    "evaluate.py output= a checkpoint": (
        [*EVALUATE, "input=s.txt", f"output={CKPT}"],
        rf"error: output={CKPT} is {CKPT}, an input of this run, .*",
    ),
    "evaluate.py output= its prefixes=": (
        [*EVALUATE, "input=s.txt", "prefixes=p.txt", "output=p.txt"],
        r"error: output=p.txt is p.txt, an input of this run, which writing it would destroy; "
        r"give output= a new file",
    ),
    "evaluate.py output= its constraints=": (
        ["evaluate.py", f"ckpt_path={CKPT}", "input=s.txt", "constraints=c.txt", "output=c.txt"],
        r"error: output=c.txt is c.txt, an input of this run, .*",
    ),
    "evaluate.py score=true force=true output= the split's reference": (
        [
            "evaluate.py",
            f"ckpt_path={CKPT}",
            "score=true",
            "split=test",
            "data.root=corpus",
            "output=corpus/test.de",
            "force=true",
        ],
        r"error: output=corpus/test.de is corpus/test.de, an input of this run, .*",
    ),  # fmt: skip
    "evaluate.py output= the tokenizer of the exported model it runs": (
        [
            "evaluate.py",
            "ckpt_path=model",
            "engine=ctranslate2",
            "decode=greedy",
            "input=s.txt",
            "output=model/target.spm.model",
        ],
        r"error: output=model/target.spm.model is model/target.spm.model, an input of this "
        r"run, .*",
    ),  # fmt: skip
    "evaluate.py output= longer than its gzipped input=": (
        [*EVALUATE, "input=two.txt.gz", "output=out5.txt"],
        r"error: output=out5.txt holds results for 5 lines but input=two.txt.gz has 2: it "
        r"belongs to another input; .*force=true to replace it",
    ),
    "evaluate.py resuming an output= of standard input": (
        [*EVALUATE, "input=-", "output=out5.txt"],
        r"error: output=out5.txt holds the results of 5 lines; resuming would skip the first 5 "
        r"lines of input=- \(standard input, .*\): give the input as input=FILE, or force=true .*",
    ),
    "a new train.py run in a run directory holding checkpoints": (
        ["train.py", "hydra.run.dir=run", "trainer.max_steps=2"],
        r"error: .*/user/run/checkpoints holds the checkpoints of an earlier run \(last\.ckpt, "
        r"epochs/epoch=1\.ckpt, epochs/epoch=2\.ckpt and 1 more\), "
        r"which a new run would replace; resume that run with ckpt_path=.*run/checkpoints/"
        r"last\.ckpt, give this one another directory .*, or force=true to delete them first",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", OVERWRITES)
def test_a_command_refuses_to_overwrite_its_input_or_an_earlier_result(
    case, corpus, workspace, tmp_path
):
    user = tmp_path / "user"
    shutil.copytree(workspace, user, symlinks=True)
    before = checksums(user)
    command, error = OVERWRITES[case]
    if command[0] == "train.py":
        command = [command[0], *tiny_overrides(corpus), *command[1:]]
    if command[0] in ("train.py", "evaluate.py"):
        command = [str(REPO / command[0]), *command[1:]]
        if not any(c.startswith("hydra.run.dir=") for c in command):  # not in the user's folder
            command.append(f"hydra.run.dir={tmp_path / 'elsewhere'}")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    res = subprocess.run([sys.executable, *command], cwd=user, env=env, input="a dog\n",
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert res.returncode != 0 and res.stdout == "", res.stderr[-3000:]
    assert re.fullmatch(error, res.stderr.strip().splitlines()[-1]), res.stderr[-3000:]
    assert "Traceback" not in res.stderr
    assert checksums(user) == before


@pytest.mark.slow
def test_a_second_run_in_a_directory_being_trained_in_is_refused(corpus, tmp_path):
    """A training run holds its run directory's lock (here the test holds it, as a first run
    would): a second train.py there refuses before writing anything, though the first has no
    checkpoint yet; its .hydra/ record is not replaced."""
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text("- seed=1\n")
    before = checksums(run)
    command = [sys.executable, "train.py", *tiny_overrides(corpus), f"hydra.run.dir={run}",
               "seed=2", "trainer.max_steps=2"]  # fmt: skip
    with run_dir.claim_training_run(compose_cfg(tiny_overrides(corpus), run)):
        res = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 1, res.stderr[-3000:]
    assert res.stderr.strip().splitlines()[-1] == (
        f"error: another run is training in {run} now (it holds the directory's lock); wait for "
        "it to end, or give this run another directory (hydra.run.dir=DIR)"
    )
    assert checksums(run) == before


@pytest.mark.parametrize("command", ["train", "evaluate"])
def test_two_launches_in_the_same_second_get_run_directories_of_their_own(command):
    """The default run directory's name ends in microseconds: two runs started in one second
    (a sweep's, a script's) no longer share one directory, checkpoints and log."""
    dirs = []
    for _ in range(2):
        with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
            cfg = compose(command, overrides=["ckpt_path=x"], return_hydra_config=True)
        dirs.append(cfg.hydra.run.dir)
    assert all(re.search(r"/\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d\.\d{6}$", d) for d in dirs), dirs
    assert dirs[0] != dirs[1]


@pytest.mark.slow
def test_stdout_holds_the_translations_alone_and_every_log_line_goes_to_stderr(
    corpus, workspace, tmp_path
):
    """`evaluate.py input=F > out.txt`, the README's usage, while averaging two checkpoints (a
    log line) and cutting an overlong line (a warning): stdout is the translations, line for
    line. train.py, progress bar on, writes nothing to stdout."""
    for name in ("a", "b"):
        shutil.copy(workspace / CKPT, tmp_path / f"{name}.ckpt")
    text = tmp_path / "in.txt"
    text.write_text("a dog runs\n" + "a " * 300 + "\nthe cat\n")
    evaluate_py = [
        sys.executable, "evaluate.py", f"ckpt_path=[{tmp_path / 'a.ckpt'},{tmp_path / 'b.ckpt'}]",
        f"input={text}", "decode=greedy", f"hydra.run.dir={tmp_path / 'eval'}",
    ]  # fmt: skip
    res = subprocess.run(evaluate_py, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "averaging 2 checkpoints" in res.stderr and "more than 256 pieces" in res.stderr
    assert res.stdout == (tmp_path / "eval" / "hypotheses.txt").read_text()
    assert len(res.stdout.splitlines()) == 3

    train_py = [
        sys.executable, "train.py", *tiny_overrides(corpus), "trainer.max_steps=2",
        "trainer.enable_progress_bar=true", f"hydra.run.dir={tmp_path / 'run'}",
    ]  # fmt: skip
    res = subprocess.run(train_py, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout == "" and "finished at step 2" in res.stderr


@pytest.mark.slow
def test_force_replaces_only_what_the_command_writes(corpus, workspace, tmp_path):
    """train.py force=true deletes the earlier run's checkpoints (nothing else) before training;
    evaluate.py force=true translates output= again from its start; averaging --force replaces
    an output that is no input."""
    run = tmp_path / "run"
    shutil.copytree(workspace / "run", run)
    (run / "checkpoints" / "notes.txt").write_text("kept\n")
    overrides = [*tiny_overrides(corpus), "trainer.max_steps=3"]
    with pytest.raises(UserError, match="holds the checkpoints of an earlier run"):
        train(compose_cfg(overrides, run))
    train(compose_cfg([*overrides, "force=true"], run))
    kept = [str(p.relative_to(run)) for p in sorted(run.glob("checkpoints/**/*")) if p.is_file()]
    assert kept == ["checkpoints/last.ckpt", "checkpoints/notes.txt"]  # epochs/*.ckpt deleted
    assert load_checkpoint(run / "checkpoints" / "last.ckpt")["global_step"] == 3

    user = tmp_path / "user"
    shutil.copytree(workspace, user, symlinks=True)
    cfg = compose_eval_cfg([
        f"ckpt_path={user / CKPT}", f"input={user / 's.txt'}", f"output={user / 'out5.txt'}",
        "decode=greedy", "force=true",
    ], tmp_path / "eval")  # fmt: skip
    assert evaluate(cfg)["resumed_at"] == 0
    assert len((user / "out5.txt").read_text().splitlines()) == 4  # s.txt's lines, not 5 + 4

    average = [sys.executable, "-m", "transformer.checkpoints", "out5.txt", *EPOCHS[:2]]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    res = subprocess.run([*average, "--force"], cwd=user, env=env, capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    assert load_checkpoint(user / "out5.txt")["averaged_from"] == EPOCHS[:2]


@pytest.mark.slow
def test_an_output_of_a_gzipped_input_is_checked_against_its_lines_then_resumed(
    workspace, tmp_path
):
    """A .gz input's lines are counted when an output is resumed: one holding more is refused,
    unchanged; one holding part of them is completed, as for a plain file."""
    user = tmp_path / "user"
    shutil.copytree(workspace, user, symlinks=True)
    whole, part = user / "whole.txt", user / "part.txt"

    def run(output: Path) -> dict:
        return evaluate(compose_eval_cfg([
            f"ckpt_path={user / CKPT}", f"input={user / 'two.txt.gz'}", f"output={output}",
            "decode=greedy",
        ], tmp_path / output.stem))  # fmt: skip

    longer = (user / "out5.txt").read_bytes()
    with pytest.raises(UserError, match=r"out5.txt holds results for 5 lines but input=.* has 2"):
        run(user / "out5.txt")
    assert (user / "out5.txt").read_bytes() == longer
    run(whole)
    part.write_text(whole.read_text().splitlines()[0] + "\nhalf a li")
    assert run(part)["resumed_at"] == 1 and part.read_bytes() == whole.read_bytes()


def evaluate_file(workspace: Path, tmp_path: Path) -> str:
    """A script's lines that translate the workspace's s.txt with its checkpoint, as evaluate.py
    does."""
    return f"""
from hydra import compose, initialize_config_dir
from transformer.evaluation import evaluate
with initialize_config_dir("{CONFIG_DIR}", version_base="1.3"):
    cfg = compose("evaluate", overrides=["ckpt_path={workspace / CKPT}",
                  "input={workspace / "s.txt"}", "decode=greedy",
                  "paths.output_dir={tmp_path / "eval"}"])
evaluate(cfg)
"""


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
@pytest.mark.skipif(not ONEDNN, reason="no oneDNN linear kernel in this PyTorch build")
def test_translating_keeps_the_kernels_of_few_shapes(workspace, tmp_path):
    """After evaluate(), products of shapes not seen before hold no more memory once the kernel
    caches are full (transformer/allocator.py: 64 kernels each). Decoding's batches change shape
    at almost every step; PyTorch's default of 1024 kernels a cache held about half a MiB for
    each, and the peak RSS of a translation grew with the file's length (docs/benchmarks.md)."""
    translated, plain = heap_held_by_new_shapes(evaluate_file(workspace, tmp_path), tmp_path)
    assert translated < 4  # MiB: the caches hold what they held
    assert plain > 40  # PyTorch's caches: the comparison above can fail


# -- issue 51: temporaries, interrupted tokenizer training, damaged caches ----------------------


def random_corpus(root: Path, pairs: int, seed: int = 0) -> Path:
    """``train``/``val``/``test`` of made-up words of random letters: SentencePiece needs
    seconds on ``pairs`` training pairs (tens of thousands), where the tiny corpus takes
    milliseconds."""
    root.mkdir(parents=True)
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choices(letters, k=rng.randint(2, 12))) for _ in range(20_000)]
    for split, n in (("train", pairs), ("val", 32), ("test", 32)):
        for lang in ("en", "de"):
            lines = (" ".join(rng.choices(words, k=rng.randint(5, 20))) for _ in range(n))
            write_lines(root / f"{split}.{lang}", list(lines))
    return root


def child_processes(pid: int) -> dict[int, bytes]:
    """The children of process ``pid`` (from /proc) and their command lines."""
    children = {}
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
            if entry.name.isdigit() and int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                children[int(entry.name)] = (entry / "cmdline").read_bytes()
        except (OSError, ValueError):  # gone meanwhile
            continue
    return children


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_ctrl_c_or_sigterm_stops_tokenizer_training_at_once(tmp_path, signum):
    """SentencePiece trains in a child process: Ctrl-C or SIGTERM while it trains ends the run at
    once, not when the C++ training ends (it never does: no model is written), with one error
    line; the child is gone, and no temporary is left in the cache."""
    corpus = random_corpus(tmp_path / "corpus", pairs=20_000)
    run = tmp_path / "run"
    proc = start_train_py(corpus, run, "data.vocab_size=4000", "trainer.max_steps=2")
    deadline, trainer = time.monotonic() + 300, None
    while trainer is None and time.monotonic() < deadline and proc.poll() is None:
        children = child_processes(proc.pid).items()
        trainer = next((pid for pid, cmd in children if b"SentencePieceTrainer" in cmd), None)
        time.sleep(0.02)
    assert trainer is not None, "SentencePiece never trained in a child process"
    proc.send_signal(signum)
    sent = time.monotonic()
    _, stderr = proc.communicate(timeout=120)
    assert time.monotonic() - sent < 60, "the run waited for SentencePiece"
    assert proc.returncode == 1 and "Traceback" not in stderr
    name = signal.Signals(signum).name
    assert stderr.strip().splitlines()[-1] == (
        f"error: {name} during data preparation: stopped; what was finished is kept and nothing "
        "half-written is left; run the same command again to go on"
    )
    assert not Path(f"/proc/{trainer}").exists()
    assert not [p for p in (corpus / "cache").rglob("*") if p.is_file()]


# a token cache and a checkpoint written at once by another process, which is then killed
KILLED_WRITES = (
    "import sys, time; from pathlib import Path; from transformer.atomic import "
    "atomic_directory, atomic_write; atomic_directory(Path(sys.argv[1]), lambda d: (d.mkdir(), "
    "(d / 'tokens.arrow').write_bytes(bytes(1 << 20)), atomic_write(Path(sys.argv[2]), "
    "lambda f: (f.write(b'PK half'), f.flush(), print(flush=True), time.sleep(300)))))"
)


@pytest.mark.slow
def test_temporaries_of_killed_runs_are_removed_by_the_next(corpus, tmp_path):
    """A run killed (SIGKILL) while writing a token cache and a checkpoint leaves their
    temporary folders. The next run removes them, and keeps those of a running writer and of
    another host (whose processes cannot be seen)."""
    root = tmp_path / "corpus"
    shutil.copytree(corpus, root, ignore=shutil.ignore_patterns("cache"))
    tok, ckpts = root / "cache" / "tok", tmp_path / "run" / "checkpoints"
    tok.mkdir(parents=True)
    ckpts.mkdir(parents=True)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    cmd = [sys.executable, "-c", KILLED_WRITES, str(tok / "local-corpus.train.en-de.0123"),
           str(ckpts / "last.ckpt")]  # fmt: skip
    killed = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE)
    killed.stdout.readline()  # both temporaries are written
    killed.kill()
    killed.wait()
    (cache_left,), (checkpoint_left,) = tok.iterdir(), ckpts.iterdir()
    assert (cache_left / "local-corpus.train.en-de.0123" / "tokens.arrow").is_file()
    assert (checkpoint_left / "last.ckpt").read_bytes() == b"PK half"
    elsewhere = tok / f".another.{'0' * 32}.tmp"  # another host's, its writer not seen here
    elsewhere.mkdir()
    marker = {"token": "0" * 32, "host": "some-other-host"}
    (elsewhere / atomic.MARKER).write_text(json.dumps(marker))
    with atomic.temporary_folder(tok / "running") as running:  # this process's, being written
        train(compose_cfg([*tiny_overrides(root), "trainer.max_steps=1"], tmp_path / "run"))
        assert running.is_dir()
    assert not cache_left.exists() and not checkpoint_left.exists()
    assert elsewhere.is_dir()


@pytest.mark.slow
def test_a_damaged_token_cache_is_built_again(corpus, tmp_path, caplog):
    """A token cache cut short or overwritten inside (a disk fault, a copy cut short) is found
    damaged when loaded, said so in the log, and built again, equal to the first."""
    root = tmp_path / "corpus"
    shutil.copytree(corpus, root, ignore=shutil.ignore_patterns("cache"))
    overrides = [*tiny_overrides(root), "trainer.max_steps=1"]
    train(compose_cfg(overrides, tmp_path / "a"))
    files = {p: p.read_bytes() for p in sorted((root / "cache" / "tok").glob("*/tokens.arrow"))}
    train_split, val_split = (
        next(p for p in files if f".{s}." in str(p)) for s in ("train", "val")
    )
    train_split.write_bytes(files[train_split][: len(files[train_split]) // 2])
    damaged = bytearray(files[val_split])
    damaged[200:600] = b"\xff" * 400  # the list offsets: negative, out of order
    val_split.write_bytes(bytes(damaged))
    with caplog.at_level(logging.WARNING, logger="transformer.data.prepare"):
        train(compose_cfg(overrides, tmp_path / "b"))
    for split in (train_split, val_split):
        assert f"the token cache {split} is damaged" in caplog.text
    assert caplog.text.count(": building it again") == 2
    assert {p: p.read_bytes() for p in files} == files


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["truncated", "not gzip"])
def test_a_damaged_gz_input_to_evaluate_is_named(trained, tmp_path, fault):
    """``evaluate.py input=FILE.gz`` with a gzip file cut short, or a plain file named .gz: an
    error naming the file and the fix, the file as it was."""
    source = tmp_path / "source.en.gz"
    write_lines(source, ["a dog runs", "the man sits"] * 200)
    data = source.read_bytes()
    source.write_bytes(data[: len(data) // 2] if fault == "truncated" else b"a dog runs\n")
    before = source.read_bytes()
    ckpt = trained / "checkpoints" / "last.ckpt"
    message = "its gzip data is truncated or damaged" if fault == "truncated" else "is not a gzip"
    with pytest.raises(DataError, match=rf"^{source}(: | ){message}"):
        evaluate(compose_eval_cfg([f"ckpt_path={ckpt}", f"input={source}"], tmp_path / "out"))
    assert source.read_bytes() == before


# -- issue 68: temporaries that can only be ours, every file read an input, the run-dir race ----


def dead_pid() -> int:
    """The id of a process of this host that has ended."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def plant_look_alikes(folder: Path) -> dict[str, str]:
    """A user's hidden entries named as temporaries are, or were in earlier versions (a process
    that no longer runs, this host, 32 hex digits, a marker with another token): files and
    folders, none of them written by this project. Returns their checksums."""
    pid, token = dead_pid(), "ab" * 16
    marker = json.dumps({"token": "cd" * 16, "host": HOST})  # another token than its folder's
    entries = {
        ".photos.2024.tmp/a.jpg": b"\xff\xd8 a photo",
        f".notes.txt.{pid}.tmp": b"my notes\n",
        f".draft.{pid}@{HOST}.tmp/draft.txt": b"a draft\n",
        f".m.ckpt.{pid}@{HOST}.tmp": b"PK a checkpoint of mine",
        f".album.{token}.tmp/b.jpg": b"\xff\xd8 another photo",
        f".backup.{token}.tmp/transformer-nmt-temporary.json": marker,
    }
    for name, data in entries.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data if isinstance(data, bytes) else data.encode())
    return checksums(folder)


@pytest.mark.slow
def test_no_command_removes_a_users_entry_that_looks_like_a_temporary(trained, corpus, tmp_path):
    """Beside a checkpoint and beside an export's target: resuming, exporting, averaging,
    pruning and evaluating leave every look-alike of a temporary as it was (the sweep removes
    only folders marked as its own whose writer is gone)."""
    user = tmp_path / "downloads"
    user.mkdir()
    shutil.copy(trained / "checkpoints" / "last.ckpt", user / "m.ckpt")
    planted = plant_look_alikes(user)
    hidden = sorted(p.name for p in user.iterdir() if p.name.startswith("."))

    def unchanged() -> None:
        assert {k: v for k, v in checksums(user).items() if k in planted} == planted

    overrides = [*tiny_overrides(corpus), "trainer.max_steps=18", f"ckpt_path={user / 'm.ckpt'}"]
    train(compose_cfg(overrides, tmp_path / "resumed"))
    unchanged()
    export_ct2([user / "m.ckpt"], user / "model")
    unchanged()
    average_main([str(user / "avg.ckpt"), str(user / "m.ckpt"), str(user / "m.ckpt")])
    prune_main([str(user / "m.ckpt"), str(user / "pruned.ckpt"), "--heads", "cross:0:0"])
    (user / "in.txt").write_text("a dog runs\n")
    evaluate(compose_eval_cfg([
        f"ckpt_path={user / 'm.ckpt'}", f"input={user / 'in.txt'}", f"output={user / 'out.txt'}",
        "decode=greedy",
    ], user / "eval"))  # fmt: skip
    unchanged()
    assert sorted(p.name for p in user.iterdir() if p.name.startswith(".")) == hidden  # no others


def test_an_input_in_the_run_directory_is_refused_before_its_results_are_cleared(tmp_path):
    """evaluate deletes the results of an earlier run in its run directory when it starts: an
    input that is one of them (an earlier run's hypotheses.txt translated back, in its run
    directory) is refused first, and kept."""
    run = tmp_path / "eval"
    run.mkdir()
    (run / "hypotheses.txt").write_text("ein Hund läuft\n")
    before = checksums(run)
    hypotheses = run / "hypotheses.txt"
    with pytest.raises(ConfigError, match=rf"^{hypotheses} is {hypotheses}, where this run writes "
                       r"its hypotheses.txt: .* \(hydra.run.dir=DIR\)$"):  # fmt: skip
        evaluate(compose_eval_cfg([f"ckpt_path={tmp_path / 'm.ckpt'}", f"input={hypotheses}"], run))
    assert checksums(run) == before


@pytest.mark.slow
def test_two_runs_started_at_once_in_one_directory_leave_only_the_winners_record(corpus, tmp_path):
    """Two train.py started at the same instant in one hydra.run.dir (seeds 1 and 2), three
    times: one trains, the other is refused by the directory's lock before Hydra writes there,
    so .hydra/ and train.log are the winner's alone."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    for attempt in range(3):
        run = tmp_path / f"run{attempt}"
        procs = {
            seed: subprocess.Popen(
                [
                    sys.executable,
                    "train.py",
                    *tiny_overrides(corpus),
                    f"hydra.run.dir={run}",
                    f"seed={seed}",
                    "trainer.max_steps=2",
                ],
                cwd=REPO,
                env=env,
                stderr=subprocess.PIPE,
                text=True,
            )  # fmt: skip
            for seed in (1, 2)
        }
        errors = {seed: proc.communicate(timeout=180)[1] for seed, proc in procs.items()}
        codes = {seed: proc.returncode for seed, proc in procs.items()}
        assert sorted(codes.values()) == [0, 1], errors
        (winner,) = (seed for seed, code in codes.items() if code == 0)
        loser = 3 - winner
        assert errors[loser].strip().splitlines()[-1] == (
            f"error: another run is training in {run} now (it holds the directory's lock); wait "
            "for it to end, or give this run another directory (hydra.run.dir=DIR)"
        )
        assert f"- seed={winner}\n" in (run / ".hydra" / "overrides.yaml").read_text()
        assert f"\nseed: {winner}\n" in (run / ".hydra" / "config.yaml").read_text()
        log = (run / "train.log").read_text()
        assert log.count("[transformer.training.run][INFO] - model:") == 1  # one run's lines


EVALUATE_ERRORS = {  # case -> (the files it writes, its overrides, its error)
    "a prefix longer than the model takes": (
        {"p.txt": "ein\n" + "ein " * 300 + "\n"},
        ["prefixes=p.txt", "decode=greedy"],
        r"prefixes=.*/p\.txt, line 2: the prefix has \d+ pieces; the model's translations take "
        r"at most 255: shorten it",
    ),
    "a constraint the target vocabulary cannot write": (
        {"c.txt": '[]\n["Hund"]\n'},
        ["constraints=c.txt"],
        r"constraints=.*/c\.txt, line 2: constraint 'Hund' has characters the target vocabulary "
        r"lacks .*; give a phrase the model can write",
    ),
    "output= a .gz file": (
        {},
        ["output=out.txt.gz", "decode=greedy"],
        r"output=.*/out\.txt\.gz: results are written as plain text, .*; give a name without "
        r"\.gz, and gzip the file once it is done",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", EVALUATE_ERRORS)
def test_bad_evaluation_input_is_one_line_naming_its_file(case, trained, tmp_path):
    files, overrides, error = EVALUATE_ERRORS[case]
    (tmp_path / "in.txt").write_text("a dog runs\nthe man sits\n")
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    overrides = [re.sub(r"=(\w+\.txt(\.gz)?)$", rf"={tmp_path}/\1", o) for o in overrides]
    cfg = compose_eval_cfg([
        f"ckpt_path={trained / 'checkpoints' / 'last.ckpt'}", f"input={tmp_path / 'in.txt'}",
        *overrides,
    ], tmp_path / "eval")  # fmt: skip
    with pytest.raises(UserError, match=rf"^{error}$") as raised:
        evaluate(cfg)
    assert "\n" not in str(raised.value)
    assert not (tmp_path / "out.txt.gz").exists()


@pytest.mark.slow
def test_force_starts_fresh_logs_and_keeps_the_earlier_runs_aside(corpus, tmp_path):
    """train.py force=true in a directory of an earlier run: its checkpoints are deleted, and its
    logs (train.log, .hydra/, the CSV log) move to replaced/1/, whole, so the new run's logs hold
    the new run alone."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    run = tmp_path / "run"
    command = [sys.executable, "train.py", *tiny_overrides(corpus), f"hydra.run.dir={run}"]
    for extra in (["trainer.max_steps=3"], ["trainer.max_steps=2", "force=true"]):
        res = subprocess.run([*command, *extra], cwd=REPO, env=env, capture_output=True,
                             text=True, timeout=180)  # fmt: skip
        assert res.returncode == 0, res.stderr[-3000:]
        if "force=true" not in extra:
            earlier = checksums(run)
    aside = {k.removeprefix("replaced/1/"): v for k, v in checksums(run).items()
             if k.startswith("replaced/1/")}  # fmt: skip
    assert aside == {k: v for k, v in earlier.items() if not k.startswith("checkpoints/")}
    assert {".hydra/config.yaml", "train.log", "csv/version_0/metrics.csv"} <= set(aside)
    log = (run / "train.log").read_text()
    assert log.count("finished at step") == 1 and "finished at step 2" in log
    assert "- force=true" in (run / ".hydra" / "overrides.yaml").read_text()
    assert [p.name for p in (run / "csv").iterdir()] == ["version_0"]
    assert len(logged(run, "train/loss")) == 2
