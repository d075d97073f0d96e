"""Every precision and optimizer-step combination a GPU run can reach, trained on CPU.

A GPU run picks bf16-mixed (16-mixed on GPUs without bf16), fused AdamW and gradient clipping by
default, and users add gradient accumulation and ``compile=true`` (or ``compile=layers``). Each
combination below trains a few real steps of the tiny model through ``train(cfg)``, as ``train.py``
does: the loss falls, no logged value is NaN, and the last checkpoint holds finite weights.
``torch.compile`` runs with the ``aot_eager`` backend, which traces the same forward and backward
graphs as inductor without generating code (inductor itself: ``INDUCTOR_TESTS=1``,
tests/training/test_lit_module.py)."""

from __future__ import annotations

import itertools
import logging
import math
from pathlib import Path

import pytest
import torch

from tests.tiny import compose_cfg, logged, tiny_overrides
from transformer import precision
from transformer.checkpoints import load_checkpoint
from transformer.errors import ConfigError
from transformer.training import train, trainer

pytestmark = pytest.mark.heavy

PRECISIONS = ["32-true", "bf16-mixed", "16-mixed"]
MATRIX = list(
    itertools.product(PRECISIONS, [False, True], [False, True], [1, 2], [False, True])
)  # precision x fused x clip x accumulate x compile
MATRIX += [(p, True, True, 2, "layers") for p in PRECISIONS]  # compile=layers, each precision
STEPS = 8


@pytest.fixture(scope="module")
def corpus(corpus: Path, tmp_path_factory) -> Path:
    """conftest's corpus, tokenized once for every combination (SentencePiece, cached splits)."""
    once = ["trainer.max_steps=1", "trainer.limit_val_batches=0", "~callbacks.best_checkpoint"]
    train(compose_cfg([*tiny_overrides(corpus), *once], tmp_path_factory.mktemp("warm")))
    return corpus


def combination_id(combo) -> str:
    precision, fused, clip, accumulate, compiled = combo
    compiled = {False: "eager", True: "compile"}.get(compiled, compiled)
    return (
        f"{precision}-{'fused' if fused else 'foreach'}-{'clip' if clip else 'noclip'}"
        f"-acc{accumulate}-{compiled}"
    )


@pytest.mark.slow
@pytest.mark.parametrize("combo", MATRIX, ids=[combination_id(c) for c in MATRIX])
def test_combination_trains(corpus, tmp_path, combo):
    precision, fused, clip, accumulate, compiled = combo
    overrides = [
        *tiny_overrides(corpus),
        f"trainer.precision={precision}",
        f"optim.optimizer.fused={str(fused).lower()}",
        f"trainer.gradient_clip_val={1.0 if clip else 0.0}",
        f"trainer.accumulate_grad_batches={accumulate}",
        f"compile={str(compiled).lower()}",  # false, true or layers
        "compile_backend=aot_eager",
        f"trainer.max_steps={STEPS}",
        "trainer.limit_val_batches=0",
        "~callbacks.best_checkpoint",  # monitors val/bleu; validation is off here
        "optim.optimizer.lr=5e-3",
        "optim.scheduler.warmup_steps=2",
        "model.dropout=0.0",
    ]
    metrics = train(compose_cfg(overrides, tmp_path))

    losses = logged(tmp_path, "train/loss")
    assert len(losses) >= STEPS and all(math.isfinite(x) for x in losses), losses
    assert sum(losses[-2:]) / 2 < sum(losses[:2]) / 2 - 0.2, losses  # it learns
    assert ("train/grad_norm" in metrics) == clip  # clipping ran, and only when asked
    ckpt = load_checkpoint(tmp_path / "checkpoints" / "last.ckpt")
    assert ckpt["global_step"] == STEPS
    assert all(torch.isfinite(w).all() for w in ckpt["state_dict"].values())
    if precision == "16-mixed":  # the GradScaler's state travels for an exact resume
        assert ckpt["MixedPrecision"]["scale"] > 0


@pytest.mark.slow
def test_clipping_bounds_the_update_norm_under_bf16_with_fused_adamw(corpus, tmp_path):
    """With a clip far below the gradient norm, the logged norm is the norm before clipping and
    training still moves: the clipped gradients reach the fused kernel."""
    overrides = [
        *tiny_overrides(corpus),
        "trainer.precision=bf16-mixed",
        "optim.optimizer.fused=true",
        "trainer.gradient_clip_val=0.01",
        "trainer.max_steps=3",
        "trainer.limit_val_batches=0",
        "~callbacks.best_checkpoint",
    ]
    metrics = train(compose_cfg(overrides, tmp_path))
    assert metrics["train/grad_norm"] > 0.01


def test_unknown_compile_backend_is_named_before_data_work(tmp_path):
    cfg = compose_cfg(
        ["compile=true", "compile_backend=inductr", "data.root=/nonexistent"], tmp_path
    )
    with pytest.raises(ConfigError, match=r"compile_backend='inductr'.*inductor"):
        train(cfg)


@pytest.mark.parametrize(
    "setting, speedup, want, reason",
    [
        ("auto", 2.4, "bf16-mixed", "multiplies bf16 matrices at 2.40x float32's speed"),
        ("auto", 1.1, "32-true", "multiplies bf16 matrices at 1.10x float32's speed"),
        ("auto", 0.52, "32-true", "multiplies bf16 matrices at 0.52x float32's speed"),
        ("auto", None, "32-true", "has no bf16 instructions"),
        ("32-true", 2.4, "32-true", None),
        ("bf16-mixed", None, "bf16-mixed", None),
        ("16-mixed", 2.4, "16-mixed", None),
    ],
)
def test_auto_precision_on_cpu_is_bf16_mixed_only_where_bf16_products_are_faster(
    setting, speedup, want, reason, monkeypatch, caplog
):
    """``auto`` on CPU picks bf16-mixed only where the CPU multiplies bf16 matrices clearly
    faster than float32 ones (the measurement stubbed): not where it has bf16 instructions that
    are slower, nor where it has none; the log says which and why, and any explicit value wins."""
    monkeypatch.setattr(trainer, "cpu_bf16_speedup", lambda: speedup)
    cfg = compose_cfg(["trainer.accelerator=cpu", f"trainer.precision={setting}"])
    with caplog.at_level(logging.INFO, logger="transformer.training.trainer"):
        assert trainer.resolve_precision(cfg.trainer) == want
    if reason is None:
        assert "trainer.precision=auto" not in caplog.text
    else:
        assert f"trainer.precision=auto: {want}, this CPU {reason}" in caplog.text


def test_cpu_bf16_speedup_is_measured_only_where_the_cpu_has_bf16_instructions(monkeypatch):
    """Without AVX512-BF16 or AMX there is nothing to measure (oneDNN emulates bf16); with
    them, products of both dtypes are timed and their speed ratio returned."""
    measure = precision.cpu_bf16_speedup.__wrapped__
    flags = Path("/proc/cpuinfo").read_text().split() if Path("/proc/cpuinfo").is_file() else []
    if not {"avx512_bf16", "amx_bf16"} & set(flags):
        assert precision.cpu_bf16_speedup() is None
    for avx512_bf16, amx in [(False, False), (True, False), (False, True)]:
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda v=avx512_bf16: v)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda v=amx: v)
        speedup = measure(n=64, repeats=1)
        if avx512_bf16 or amx:
            assert speedup is not None and 0 < speedup < math.inf
        else:
            assert speedup is None


@pytest.mark.parametrize("major, train_precision, decode_dtype", [
    (7, "16-mixed", torch.float16),  # V100, T4: bf16 only emulated
    (8, "bf16-mixed", torch.bfloat16),  # A100 and later
    (9, "bf16-mixed", torch.bfloat16),
])  # fmt: skip
def test_auto_precision_on_a_gpu_takes_bf16_only_where_it_is_native(
    monkeypatch, major, train_precision, decode_dtype
):
    """A stubbed CUDA device of compute capability major.0 on which bf16 tensors can be made
    (the emulation older GPUs have): training's and decoding's ``auto`` pick bf16 from 8.0 on,
    fp16 (with a GradScaler in training) below."""
    from types import SimpleNamespace

    from transformer.device import decoding_dtype

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: SimpleNamespace(major=major))
    monkeypatch.setattr(torch.cuda, "_check_bf16_tensor_supported", lambda d: True)
    monkeypatch.setattr(torch.version, "hip", None)
    cfg = compose_cfg(["trainer.accelerator=gpu", "trainer.precision=auto"])
    assert trainer.resolve_precision(cfg.trainer) == train_precision
    assert decoding_dtype("auto", torch.device("cuda")) == decode_dtype
