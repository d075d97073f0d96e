"""Fault injection: interrupted checkpoint writes, kills and signals, NaN losses, bad input.

The README's "What happens when..." section points here; each test states one guarantee.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from tiny_corpus import compose_cfg, tiny_overrides, write_corpus

from transformer import atomic
from transformer.atomic import AtomicCheckpointIO
from transformer.checkpoints import load_checkpoint
from transformer.training import train


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus"))


def fail_mid_write(monkeypatch) -> None:
    """Make the next checkpoint write put out half its bytes, then fail (a full disk, a kill)."""

    def partial_save(obj, f) -> None:
        f.write(b"PK\x03\x04 half a checkpoint")
        raise OSError("No space left on device")

    monkeypatch.setattr(atomic.torch, "save", partial_save)


# -- interrupted checkpoint writes ----------------------------------------------------------------


def test_interrupted_write_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "last.ckpt"
    io = AtomicCheckpointIO()
    io.save_checkpoint({"step": 1, "w": torch.ones(3)}, path)
    fail_mid_write(monkeypatch)
    with pytest.raises(OSError, match="No space left"):
        io.save_checkpoint({"step": 2, "w": torch.zeros(3)}, path)
    monkeypatch.undo()
    assert torch.load(path, weights_only=True)["step"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]  # no temporary file left


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
    with pytest.raises(OSError, match="No space left"):
        train(compose_cfg(overrides, tmp_path))
    ckpt = load_checkpoint(tmp_path / "checkpoints" / "last.ckpt")
    assert ckpt["global_step"] == 2
    assert os.listdir(tmp_path / "checkpoints") == ["last.ckpt"]
