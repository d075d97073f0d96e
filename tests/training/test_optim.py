"""The optimizer and its schedules: warmup then inverse square root; the budgeted schedules
(linear, cosine, warmup-stable-decay) that end with training, by steps or by time, across a
resume; weight decay on weight matrices only, fused AdamW where it is the default."""

from __future__ import annotations

import math
from functools import partial

import pytest
import torch

from tests.tiny import compose_cfg, logged, tiny_model, tiny_overrides
from transformer.checkpoints import load_checkpoint
from transformer.errors import ConfigError
from transformer.training import train
from transformer.training.config_checks import validate_config
from transformer.training.optim import (
    BudgetLR,
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


def test_fsdp_fp16_never_gets_fused_adamw():
    """FSDP's ShardedGradScaler hands the optimizer a found_inf of shape (1,), which torch's fused
    Adam kernels cannot take: ``fused=null`` means foreach there, and ``fused=true`` is refused."""
    model = tiny_model(20, dropout=0.0)
    adamw = partial(torch.optim.AdamW, lr=1e-3, fused=None)
    if torch.cuda.is_available():
        model = model.cuda()
    assert not build_optimizer(model, adamw, 0.0, sharded_fp16=True).defaults["fused"]
    with pytest.raises(ValueError, match="optim.optimizer.fused=true .*precision=16-mixed"):
        build_optimizer(model, partial(adamw, fused=True), 0.0, sharded_fp16=True)
    # what goes wrong otherwise, on any device: the kernels' step-count correction
    steps, found_inf = [torch.tensor(1.0)], torch.full((1,), 0.0)
    with pytest.raises(RuntimeError, match="broadcast shape"):
        torch._foreach_sub_(steps, [found_inf])


# Each budgeted schedule over 20 updates, warmup 4, min_lr_ratio 0.1, WSD's cooldown 0.2: the
# factor of update n (from 1), worked out by hand from progress p = n / 20 and the decay d(p):
# min(n / 4, 0.1 + 0.9 d(p)).
HAND = {
    "linear": {1: 0.25, 4: 0.1 + 0.9 * 0.8, 10: 0.55, 15: 0.325, 19: 0.145, 20: 0.1},
    # d = (1 + cos(pi p)) / 2: p = 0.2 -> 0.904508, 0.5 -> 0.5, 0.75 -> 0.146447
    "cosine": {2: 0.5, 4: 0.914058, 10: 0.55, 15: 0.231802, 20: 0.1},
    # d = 1 until p = 0.8, then (1 - p) / 0.2
    "wsd": {3: 0.75, 4: 1.0, 16: 1.0, 17: 0.1 + 0.9 * 0.75, 18: 0.55, 20: 0.1},
}


@pytest.mark.parametrize("shape", HAND)
def test_budget_schedule_equals_the_hand_formula_and_ends_at_min_lr(shape):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=2.0)
    steps = [0]  # updates made: the progress of the next is (steps + 1) / 20
    sched = BudgetLR(opt, lambda: (steps[0] + 1) / 20, shape, 4, 0.1, 0.2)
    lrs = {}
    for n in range(1, 21):
        lrs[n] = opt.param_groups[0]["lr"]
        opt.step()
        steps[0] += 1
        sched.step()
    assert {n: lrs[n] for n in HAND[shape]} == pytest.approx(
        {n: 2.0 * f for n, f in HAND[shape].items()}, abs=1e-6
    )
    assert lrs[20] == pytest.approx(2.0 * 0.1)  # the last update at min_lr


@pytest.mark.slow
def test_budget_schedule_needs_an_end_of_training_and_names_the_fix(tmp_path):
    with pytest.raises(ConfigError, match=r"optim.scheduler.shape=wsd .* neither trainer.max_s"):
        validate_config(compose_cfg(["optim=adamw_wsd", "~experiment"], tmp_path))
    with pytest.raises(ConfigError, match=r"optim.scheduler.cooldown must be in \(0, 1\]"):
        validate_config(
            compose_cfg(["optim=adamw_wsd", "optim.scheduler.cooldown=0", "trainer.max_steps=9"])
        )
    with pytest.raises(
        ConfigError, match=r"optim.scheduler.shape=step: expected one of linear, cosine, wsd"
    ):
        validate_config(compose_cfg(["optim=adamw_cosine", "optim.scheduler.shape=step"]))
    validate_config(compose_cfg(["optim=adamw_cosine", "experiment=multi30k_en_de_cpu"]))


BUDGET = ["optim.scheduler.warmup_steps=4", "optim.scheduler.min_lr_ratio=0.1"]
PEAK = 3e-3  # tiny_overrides' learning rate


@pytest.mark.slow
def test_steps_budget_trains_on_the_hand_formula_to_min_lr(corpus, tmp_path):
    """12 steps of cosine through train(): the rate logged at each step (the one its update
    used) is the formula's at progress n / 12, and the last is min_lr."""
    overrides = [*tiny_overrides(corpus), "optim=adamw_cosine", *BUDGET, "trainer.max_steps=12"]
    train(compose_cfg(overrides, tmp_path))
    want = [PEAK * min(n / 4, 0.1 + 0.45 * (1 + math.cos(math.pi * n / 12))) for n in range(1, 13)]
    assert logged(tmp_path, "lr") == pytest.approx(want)
    assert want[-1] == pytest.approx(PEAK * 0.1)


@pytest.mark.slow
def test_time_budget_follows_the_timer_and_whichever_limit_ends_first(corpus, tmp_path):
    """A fake clock gives each step 1 s: with max_time 20 s the rate of update n follows the time
    spent before it, (n - 1) / 20; with max_steps 10 as well, the steps end first and lead."""
    clock = ["+callbacks.clock._target_=tests.fault_kit.FakeClock", "+callbacks.clock.seconds=1"]
    overrides = [*tiny_overrides(corpus), "optim=adamw_linear", *BUDGET, *clock]
    train(compose_cfg([*overrides, "+trainer.max_time=00:00:00:20"], tmp_path / "time"))
    want = [PEAK * min(n / 4, 0.1 + 0.9 * (1 - (n - 1) / 20)) for n in range(1, 21)]
    assert logged(tmp_path / "time", "lr") == pytest.approx(want)
    both = ["+trainer.max_time=00:00:00:20", "trainer.max_steps=10"]
    train(compose_cfg([*overrides, *both], tmp_path / "both"))
    want = [PEAK * min(n / 4, 0.1 + 0.9 * (1 - n / 10)) for n in range(1, 11)]
    assert logged(tmp_path / "both", "lr") == pytest.approx(want)


@pytest.mark.slow
@pytest.mark.parametrize("budget", ["steps", "time"])
def test_budget_schedule_resumes_exactly(corpus, tmp_path, budget):
    """Stopped after 6 of 14 steps (same budget) and resumed from last.ckpt: the rates and losses
    of the uninterrupted run; by time, because the Timer's elapsed time is in the checkpoint."""
    limit = {"steps": "trainer.max_steps=14", "time": "+trainer.max_time=00:00:00:14"}[budget]
    clock = ["+callbacks.clock._target_=tests.fault_kit.FakeClock", "+callbacks.clock.seconds=1"]
    common = [*tiny_overrides(corpus), "optim=adamw_wsd", *BUDGET, "optim.scheduler.cooldown=0.5",
              limit, *clock, "model.dropout=0.1", "validation.bleu_sentences=0",
              "~callbacks.best_checkpoint"]  # fmt: skip
    stop = ["+callbacks.stop._target_=tests.fault_kit.StopAtStep", "+callbacks.stop.step=6",
            "callbacks.last_checkpoint.every_n_train_steps=6"]  # fmt: skip
    full, part, resumed = tmp_path / "full", tmp_path / "part", tmp_path / "resumed"
    train(compose_cfg(common, full))
    train(compose_cfg([*common, *stop], part))
    ckpt = part / "checkpoints" / "last.ckpt"
    assert load_checkpoint(ckpt)["global_step"] == 6
    train(compose_cfg([*common, f"ckpt_path={ckpt}"], resumed))
    lrs = logged(part, "lr") + logged(resumed, "lr")
    assert len(lrs) == 14 and lrs == pytest.approx(logged(full, "lr"), abs=0)
    losses = logged(part, "train/loss") + logged(resumed, "train/loss")
    assert losses == pytest.approx(logged(full, "train/loss"), abs=1e-6)
    # the last update at progress 14/14 by steps; by time at 13/14, the time spent before it
    last = {"steps": 0.1, "time": 0.1 + 0.9 * (1 / 14) / 0.5}[budget]
    assert lrs[-1] == pytest.approx(PEAK * last)
