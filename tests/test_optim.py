"""The optimizer and its schedule: warmup then inverse square root, weight decay on weight
matrices only, fused AdamW where it is the default."""

from __future__ import annotations

import math
from functools import partial

import pytest
import torch

from tests.tiny import tiny_model
from transformer.optim import (
    build_optimizer,
    inverse_sqrt_factor,
    param_groups,
    warmup_inverse_sqrt,
)


def test_schedule_warms_up_linearly_then_decays_as_inverse_sqrt():
    w = 100
    assert inverse_sqrt_factor(0, w) == pytest.approx(1 / w)
    assert inverse_sqrt_factor(49, w) == pytest.approx(0.5)
    assert inverse_sqrt_factor(w - 1, w) == pytest.approx(1.0)
    assert inverse_sqrt_factor(4 * w - 1, w) == pytest.approx(0.5)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=2.0)
    sched = warmup_inverse_sqrt(opt, warmup_steps=4)
    lrs = []
    for _ in range(8):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[:4] == pytest.approx([0.5, 1.0, 1.5, 2.0])
    assert lrs[7] == pytest.approx(2.0 * math.sqrt(4 / 8))


def test_weight_decay_only_on_weight_matrices():
    model = tiny_model(20, dropout=0.0, tie_output_embeddings=True)
    decay, no_decay = param_groups(model, 0.1)
    embeddings = [m.weight for m in model.modules() if isinstance(m, torch.nn.Embedding)]
    ids_decay = {id(p) for p in decay["params"]}
    assert embeddings and not any(id(e) in ids_decay for e in embeddings)
    assert all(p.dim() >= 2 for p in decay["params"])
    assert all(p.dim() < 2 or p.shape[0] == 20 for p in no_decay["params"])  # vectors, embeddings
    assert model.output.weight.data_ptr() not in {p.data_ptr() for p in decay["params"]}
    n_params = len(list(model.parameters()))
    assert len(decay["params"]) + len(no_decay["params"]) == n_params
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    opt = build_optimizer(model, partial(torch.optim.AdamW, lr=1e-3, weight_decay=0.1), 0.1)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]


def test_fused_null_means_fused_on_cuda_only():
    model = tiny_model(20, dropout=0.0)
    adamw = partial(torch.optim.AdamW, lr=1e-3, weight_decay=0.1, fused=None)  # the config's
    opt = build_optimizer(model, adamw, 0.1)
    assert not opt.defaults["fused"]  # CPU: torch's default
    model(torch.tensor([[5, 6, 3]]), torch.tensor([[2, 7]])).sum().backward()
    opt.step()
    assert build_optimizer(model, partial(adamw, fused=True), 0.1).defaults["fused"]  # forced
    if torch.cuda.is_available():
        assert build_optimizer(model.cuda(), adamw, 0.1).defaults["fused"]
