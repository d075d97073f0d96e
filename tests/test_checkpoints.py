"""The checkpoint's random states; the moving average of the weights (``ema.decay``) in
checkpoints and across a resume."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from tests.tiny import compose_cfg, logged, tiny_overrides
from transformer import checkpoints
from transformer.checkpoints import load_checkpoint, model_from_checkpoint
from transformer.training import train


def test_gpu_random_state_resumes_on_a_machine_with_fewer_gpus(monkeypatch):
    """A checkpoint holds the random state of its process's own GPU; one written before that
    holds every visible GPU's, and resuming it where fewer GPUs exist restores this process's
    GPU only (``torch.cuda.set_rng_state_all`` would index a GPU that is not there)."""
    restored: list[tuple[int, Tensor]] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda: torch.full((4,), 7, dtype=torch.uint8))
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda s: restored.append((0, s)))

    def set_all(states):  # what torch does: device i for the i-th state
        for i, s in enumerate(states):
            if i >= torch.cuda.device_count():
                raise RuntimeError(f"invalid device ordinal {i}")
            restored.append((i, s))

    monkeypatch.setattr(torch.cuda, "set_rng_state_all", set_all)
    states = checkpoints.get_rng_states()
    assert torch.equal(states["cuda"], torch.full((4,), 7, dtype=torch.uint8))  # one GPU's
    checkpoints.set_rng_states(states)
    assert [(i, s.tolist()) for i, s in restored] == [(0, [7] * 4)]

    restored.clear()  # saved on two GPUs, resumed on one
    old = {
        **states,
        "cuda": [torch.full((4,), 1, dtype=torch.uint8), torch.full((4,), 2, dtype=torch.uint8)],
    }
    checkpoints.set_rng_states(old)
    assert [(i, s.tolist()) for i, s in restored] == [(0, [1] * 4)]


NO_VAL = ["validation.bleu_sentences=0", "~callbacks.best_checkpoint"]


@pytest.mark.slow
def test_ema_of_the_weights_is_the_formula_over_the_steps(corpus, tmp_path):
    """Runs of 1, 2 and 3 steps (the same seed: the same first steps) give the trained weights
    w1, w2, w3 (``current_model_state``); the 3-step run's weights (``state_dict``, what
    evaluation loads) are their average with decay 0.5: w1, then 0.5 avg + 0.5 w: 0.25 w1 +
    0.25 w2 + 0.5 w3."""
    common = [*tiny_overrides(corpus), *NO_VAL, "ema.decay=0.5", "trainer.limit_val_batches=0"]
    ckpts = []
    for steps in (1, 2, 3):
        train(compose_cfg([*common, f"trainer.max_steps={steps}"], tmp_path / str(steps)))
        ckpts.append(load_checkpoint(tmp_path / str(steps) / "checkpoints" / "last.ckpt"))
    w1, w2, w3 = (c["current_model_state"] for c in ckpts)
    assert ckpts[0]["state_dict"].keys() == w1.keys()
    for key in w1:
        want = 0.25 * w1[key] + 0.25 * w2[key] + 0.5 * w3[key]
        torch.testing.assert_close(ckpts[2]["state_dict"][key], want, rtol=0, atol=1e-6)
        torch.testing.assert_close(ckpts[0]["state_dict"][key], w1[key], rtol=0, atol=0)
    model = model_from_checkpoint(ckpts[2])  # evaluation's model: the average
    key = next(k for k in w3 if k.endswith("weight") and not torch.equal(w3[k], w2[k]))
    assert torch.equal(model.state_dict()[key.removeprefix("model.")], ckpts[2]["state_dict"][key])


@pytest.mark.slow
def test_ema_resumes_exactly(corpus, tmp_path):
    """8 steps in one run == 4 steps, checkpoint, resume to 8: the same average, trained weights
    and validation losses (validation runs on the average), dropout on. (Validation at steps 3
    and 6, not at the checkpoint's step: a validation there draws from the random stream after
    the checkpoint saved it, and a resumed run's dropout would differ, EMA or not.)"""
    common = [*tiny_overrides(corpus), *NO_VAL, "ema.decay=0.9", "model.dropout=0.1",
              "trainer.val_check_interval=3", "trainer.check_val_every_n_epoch=null"]  # fmt: skip
    full, part, resumed = tmp_path / "full", tmp_path / "part", tmp_path / "resumed"
    train(compose_cfg([*common, "trainer.max_steps=8"], full))
    train(compose_cfg([*common, "trainer.max_steps=4"], part))
    ckpt = part / "checkpoints" / "last.ckpt"
    train(compose_cfg([*common, "trainer.max_steps=8", f"ckpt_path={ckpt}"], resumed))
    want = load_checkpoint(full / "checkpoints" / "last.ckpt")
    got = load_checkpoint(resumed / "checkpoints" / "last.ckpt")
    for part_name in ("state_dict", "current_model_state"):
        for key, value in want[part_name].items():
            torch.testing.assert_close(got[part_name][key], value, rtol=0, atol=1e-6)
    assert logged(resumed, "val/loss") == pytest.approx(logged(full, "val/loss")[1:], abs=1e-6)
    assert any(
        not torch.equal(want["state_dict"][k], want["current_model_state"][k])
        for k in want["state_dict"]
    )
