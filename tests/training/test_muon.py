"""optim=muon_wsd: Muon on the layers' weight matrices (against torch.optim.Muon), AdamW on the
rest, one schedule for both, a resume that continues exactly, and a tiny run that learns."""

from __future__ import annotations

from functools import partial

import pytest
import torch

from tests.test_faults import poison_gradients
from tests.tiny import compose_cfg, logged, tiny_model, tiny_overrides
from transformer.checkpoints import load_checkpoint
from transformer.training import train
from transformer.training.muon import Muon, MuonAdamW, orthogonalise
from transformer.training.optim import build_optimizer, param_groups

SHAPES = [(96, 32), (32, 32), (64, 32), (32, 64), (64, 32)]


def test_muon_steps_as_torch_muon_does():
    """Iterating in bfloat16 as torch's does, three steps (momentum, Nesterov, weight decay,
    AdamW-matched scale) give torch.optim.Muon's weights, matrices of one shape batched."""
    torch.manual_seed(0)
    start = [torch.randn(s) for s in SHAPES]
    ours = [p.clone().requires_grad_() for p in start]
    theirs = [p.clone().requires_grad_() for p in start]
    mine = Muon(ours, lr=0.02, weight_decay=0.1, ns_dtype=torch.bfloat16)
    ref = torch.optim.Muon(theirs, lr=0.02, weight_decay=0.1, adjust_lr_fn="match_rms_adamw")
    for _ in range(3):
        for a, b in zip(ours, theirs, strict=True):
            a.grad = torch.randn_like(a)
            b.grad = a.grad.clone()
        mine.step()
        ref.step()
    for a, b, s in zip(ours, theirs, start, strict=True):
        torch.testing.assert_close(a - s, b - s, atol=1e-6, rtol=1e-3)


def test_float32_iterations_give_about_the_polar_factor():
    """In float32 (the CPU's) each matrix comes out near U V^T of its SVD: the quintic leaves
    singular values in about [0.5, 1.5] (torch.optim.Muon's note), pointing the same way."""
    g = torch.randn(3, 64, 24) * torch.logspace(-1, 1, 24)  # columns 100x apart in scale
    out = orthogonalise(g, steps=5, dtype=torch.float32)
    u, _, vh = torch.linalg.svd(g, full_matrices=False)
    sv = torch.linalg.svdvals(out)
    assert sv.min() > 0.5 and sv.max() < 1.5
    polar = u @ vh
    cosine = (out * polar).sum((-2, -1)) / (out.norm(dim=(-2, -1)) * polar.norm(dim=(-2, -1)))
    assert cosine.min() > 0.9


def test_matrices_go_to_muon_everything_else_to_adamw():
    model = tiny_model(20, dropout=0.0)
    opt = build_optimizer(model, partial(MuonAdamW, lr=1e-3, weight_decay=0.1), 0.1)
    decay, no_decay = param_groups(model, 0.1)
    muon = [p for g in opt.muon.param_groups for p in g["params"]]
    adamw = [p for g in opt.adamw.param_groups for p in g["params"]]
    assert {id(p) for p in muon} == {id(p) for p in decay["params"]}  # all 2-D here
    assert {id(p) for p in adamw} == {id(p) for p in no_decay["params"]}
    assert model.output.weight.data_ptr() in {p.data_ptr() for p in adamw}  # tied: an embedding
    assert opt.param_groups == opt.muon.param_groups + opt.adamw.param_groups
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]


def test_flat_shards_and_another_optimizers_state_refused_by_name():
    flat = torch.nn.Parameter(torch.zeros(12))
    with pytest.raises(ValueError, match="trainer=fsdp.*trainer=ddp"):
        MuonAdamW([{"params": [flat], "muon": True}])
    model = tiny_model(20)
    adamw = build_optimizer(model, partial(torch.optim.AdamW, lr=1e-3), 0.0)
    muon = build_optimizer(model, partial(MuonAdamW, lr=1e-3), 0.0)
    with pytest.raises(ValueError, match="not optim=muon_wsd's"):
        muon.load_state_dict(adamw.state_dict())


def test_a_schedule_reaches_both_before_and_after_loading():
    """The schedule sets the rate in the shared groups; loading a state gives the inner
    optimizers new group dicts, which the schedule must reach too."""
    model = tiny_model(20)
    opt = build_optimizer(model, partial(MuonAdamW, lr=1.0), 0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.5**step)
    sched.step()
    opt.load_state_dict(opt.state_dict())
    sched.step()
    for inner in (opt.muon, opt.adamw):
        assert [g["lr"] for g in inner.param_groups] == [0.25] * len(inner.param_groups)


@pytest.mark.slow
def test_muon_run_learns_and_resumes_exactly(corpus, tmp_path):
    """optim=muon_wsd through train(): the loss falls, and stopped after 6 of 12 steps and
    resumed from last.ckpt, the run's rates and losses are the uninterrupted run's."""
    common = [*tiny_overrides(corpus), "optim=muon_wsd", "optim.optimizer.lr=5e-3",
              "optim.scheduler.warmup_steps=3", "trainer.max_steps=12", "model.dropout=0.0",
              "validation.bleu_sentences=0", "~callbacks.best_checkpoint"]  # fmt: skip
    stop = ["+callbacks.stop._target_=tests.fault_kit.StopAtStep", "+callbacks.stop.step=6",
            "callbacks.last_checkpoint.every_n_train_steps=6"]  # fmt: skip
    full, part, resumed = tmp_path / "full", tmp_path / "part", tmp_path / "resumed"
    train(compose_cfg(common, full))
    losses = logged(full, "train/loss")
    assert sum(losses[-3:]) < 0.8 * sum(losses[:3])
    train(compose_cfg([*common, *stop], part))
    ckpt = part / "checkpoints" / "last.ckpt"
    assert set(load_checkpoint(ckpt)["optimizer_states"][0]) == {"muon", "adamw"}
    train(compose_cfg([*common, f"ckpt_path={ckpt}"], resumed))
    assert logged(part, "lr") + logged(resumed, "lr") == pytest.approx(logged(full, "lr"), abs=0)
    halves = logged(part, "train/loss") + logged(resumed, "train/loss")
    assert halves == pytest.approx(losses, abs=1e-6)


@pytest.mark.slow
def test_nan_gradients_skip_the_step_for_both(corpus, tmp_path, monkeypatch):
    """Two steps of NaN or inf gradients: neither Muon's momentum nor AdamW's moments take them,
    and AdamW counts the 6 updates made of 8 steps."""
    poison_gradients(monkeypatch, {3, 4})
    overrides = [*tiny_overrides(corpus), "optim=muon_wsd", "trainer.max_steps=8"]
    metrics = train(compose_cfg(overrides, tmp_path))
    assert metrics["train/skipped_steps"] == 2
    ckpt = load_checkpoint(tmp_path / "checkpoints" / "last.ckpt")
    assert all(torch.isfinite(w).all() for w in ckpt["state_dict"].values())
    muon, adamw = (ckpt["optimizer_states"][0][k]["state"].values() for k in ("muon", "adamw"))
    assert muon and all(torch.isfinite(s["momentum_buffer"]).all() for s in muon)
    assert {float(s["step"]) for s in adamw} == {6.0}
