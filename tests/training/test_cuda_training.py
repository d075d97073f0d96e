"""Lightning fits on CUDA with the GPU defaults, through ``train(cfg)`` as ``train.py`` runs them.
Skipped without a GPU; run them with ``pytest -m cuda``."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from tests.tiny import compose_cfg, logged, tiny_overrides
from transformer.checkpoints import load_checkpoint, model_from_checkpoint
from transformer.training import train

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def on_gpu(corpus: Path) -> list[str]:
    """The tiny run, with the trainer's defaults (accelerator, precision, fused AdamW, clipping)."""
    return [o for o in tiny_overrides(corpus) if not o.startswith("trainer.accelerator")]


def test_default_fit_on_gpu_learns_in_bf16_with_fused_adamw_and_clipping(corpus, tmp_path):
    metrics = train(compose_cfg([*on_gpu(corpus), "trainer.max_steps=40"], tmp_path))
    got = logged(tmp_path, "train/loss")
    assert all(math.isfinite(x) for x in got) and sum(got[-5:]) < sum(got[:5]) - 1.0, got
    assert math.isfinite(metrics["train/grad_norm"]) and math.isfinite(metrics["val/bleu"])
    ckpt = load_checkpoint(tmp_path / "checkpoints" / "last.ckpt")
    assert ckpt["global_step"] == 40 and "cuda" in ckpt["rng_states"][0]
    fused = [g["fused"] for g in ckpt["optimizer_states"][0]["param_groups"]]
    assert fused == [True, True]  # fused=null: the fused kernel on CUDA
    assert all(torch.isfinite(w).all() for w in ckpt["state_dict"].values())


@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
def test_fsdp_on_one_gpu_clips_and_writes_its_checkpoint(corpus, tmp_path, precision):
    overrides = [
        *on_gpu(corpus), "trainer=fsdp", "trainer.devices=1", f"trainer.precision={precision}",
        "trainer.max_steps=6", "validation.bleu_sentences=0", "~callbacks.best_checkpoint",
    ]  # fmt: skip
    metrics = train(compose_cfg(overrides, tmp_path))
    assert math.isfinite(metrics["train/loss"]) and math.isfinite(metrics["train/grad_norm"])
    ckpt = load_checkpoint(tmp_path / "checkpoints" / "last.ckpt")
    assert ckpt["global_step"] == 6
    # fused AdamW where the precision allows it; FSDP's fp16 scaler does not (build_optimizer)
    fused = {bool(g["fused"]) for g in ckpt["optimizer_states"][0]["param_groups"]}
    assert fused == {precision == "bf16-mixed"}  # fp16: foreach, torch's default (fused=None)


def test_muon_fits_on_gpu_in_bf16_with_fused_adamw_for_the_rest(corpus, tmp_path):
    """optim=muon_wsd on CUDA, the GPU defaults otherwise (bf16-mixed, clipping): Muon's
    Newton-Schulz iterations in bf16 there, fused AdamW on the embeddings, biases and norms. The
    loss falls, the weights and both optimizers' states stay finite."""
    overrides = [
        *on_gpu(corpus), "optim=muon_wsd", "optim.optimizer.lr=5e-3",
        "optim.scheduler.warmup_steps=3", "model.dropout=0.0", "trainer.max_steps=40",
    ]  # fmt: skip
    train(compose_cfg(overrides, tmp_path))
    got = logged(tmp_path, "train/loss")
    assert all(math.isfinite(x) for x in got) and sum(got[-5:]) < 0.8 * sum(got[:5]), got
    ckpt = load_checkpoint(tmp_path / "checkpoints" / "last.ckpt")
    states = ckpt["optimizer_states"][0]
    assert all(g["fused"] for g in states["adamw"]["param_groups"])  # fused=null on CUDA
    buffers = [s["momentum_buffer"] for s in states["muon"]["state"].values()]
    assert buffers and all(torch.isfinite(b).all() for b in buffers)
    assert all(torch.isfinite(w).all() for w in ckpt["state_dict"].values())


def test_cuda_graph_training_follows_the_eager_run_and_checkpoints(corpus, tmp_path):
    """compile=true on shape buckets, on CUDA: inductor's reduce-overhead mode, each bucket's
    step replayed from CUDA graphs, through train() with the GPU defaults (bf16-mixed, clipping,
    fused AdamW) and a validation between (eager): no graph break, no graph skipped, the losses
    of the eager run on the same batches, and last.ckpt loads into an uncompiled model. (On CPU,
    where inductor runs without CUDA graphs, the same body's losses match within 1e-4.)"""
    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters
    counters.clear()
    common = [
        *on_gpu(corpus), "data.pad_to_multiple=8", "data.num_buckets=2", "model.dropout=0.0",
        "model.num_encoder_layers=1", "model.num_decoder_layers=1",  # compile time is per layer
        "trainer.max_steps=12", "trainer.val_check_interval=6",
        "trainer.check_val_every_n_epoch=null",
    ]  # fmt: skip
    train(compose_cfg(common, tmp_path / "eager"))
    metrics = train(compose_cfg([*common, "compile=true"], tmp_path / "graphs"))
    assert not counters["graph_break"] and not counters["inductor"]["cudagraph_skips"]
    eager, graphs = (logged(tmp_path / run, "train/loss") for run in ("eager", "graphs"))
    assert len(graphs) == len(eager) == 12 and graphs == pytest.approx(eager, rel=2e-2)
    assert math.isfinite(metrics["val/loss"])
    ckpt = load_checkpoint(tmp_path / "graphs" / "checkpoints" / "last.ckpt")
    assert ckpt["global_step"] == 12 and ckpt["hyper_parameters"]["compile_model"]
    model_from_checkpoint(ckpt)  # strict: the weights kept their names
