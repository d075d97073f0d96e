"""Unit tests of the training pieces: schedule, parameter groups, loss, metrics, greedy decoding."""

from __future__ import annotations

import math
import os
import shutil
from functools import partial

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from transformer.checkpoints import model_from_checkpoint
from transformer.config import TransformerConfig
from transformer.data.collate import Batch, Collator
from transformer.lit_module import TranslationModule
from transformer.metrics import score_translations
from transformer.model import Transformer
from transformer.optim import (
    build_optimizer,
    inverse_sqrt_factor,
    param_groups,
    warmup_inverse_sqrt,
)

TINY = dict(
    src_vocab_size=20, tgt_vocab_size=20, d_model=32, num_heads=4, num_encoder_layers=2,
    num_decoder_layers=2, d_ff=64, dropout=0.0,
)  # fmt: skip


def tiny_model(**kw) -> Transformer:
    return Transformer(TransformerConfig(**{**TINY, **kw}))


def padded_batch(lengths: list[tuple[int, int]], seed: int = 0) -> Batch:
    """A collated batch of random pairs with these (source, target) lengths: right-padded."""
    rng = np.random.default_rng(seed)
    return Collator()(
        [(i, rng.integers(4, 20, s), rng.integers(4, 20, t)) for i, (s, t) in enumerate(lengths)]
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
    model = tiny_model(tie_output_embeddings=True)
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


def test_scores_and_signatures():
    hyps = ["The cat sat on the mat.", "A dog runs."]
    refs = ["The cat sat on the mat.", "a dog runs."]
    s = score_translations(hyps, refs)
    assert 0 < s.bleu < 100 and s.bleu_lc == pytest.approx(100.0)
    assert "case:lc" in s.bleu_lc_signature and "tok:13a" in s.bleu_signature
    assert s.chrf_signature.startswith("nrefs:1") and s.num_sentences == 2
    with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
        score_translations(hyps, refs[:1])


def test_training_loss_equals_cross_entropy_on_the_full_logits():
    """The module's loss (non-pad positions only, projection fused with the loss) gives the
    loss, NLL, count and every parameter's gradient of torch's cross entropy on (B, T, V)
    logits, tied embedding included."""
    module = TranslationModule(TINY, label_smoothing=0.1)
    batch = padded_batch([(5, 2), (3, 9), (8, 4), (2, 6)])  # 25 labels in (4, 10): 15 are pad

    def loss_and_grads(loss_fn) -> tuple[list[Tensor], list[Tensor]]:
        module.zero_grad()
        loss, nll, n = loss_fn()
        (loss / n).backward()
        return [loss / n, nll / n, n.float()], [p.grad.clone() for p in module.parameters()]

    def full_logits():  # (B, T, V)
        logits = module(batch.src, batch.tgt_in, batch.src_pad_mask).flatten(0, 1)
        labels = batch.labels.flatten()
        ce = partial(F.cross_entropy, logits, labels, ignore_index=0, reduction="sum")
        return ce(label_smoothing=0.1), ce().detach(), labels.ne(0).sum()

    got, got_grads = loss_and_grads(lambda: module._loss(batch))
    want, want_grads = loss_and_grads(full_logits)
    assert batch.num_tgt_tokens == 25 and int(got[2]) == 25
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    for g, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-6)


def test_fused_null_means_fused_on_cuda_only():
    model = tiny_model()
    adamw = partial(torch.optim.AdamW, lr=1e-3, weight_decay=0.1, fused=None)  # the config's
    opt = build_optimizer(model, adamw, 0.1)
    assert not opt.defaults["fused"]  # CPU: torch's default
    model(torch.tensor([[5, 6, 3]]), torch.tensor([[2, 7]])).sum().backward()
    opt.step()
    assert build_optimizer(model, partial(adamw, fused=True), 0.1).defaults["fused"]  # forced
    if torch.cuda.is_available():
        assert build_optimizer(model.cuda(), adamw, 0.1).defaults["fused"]


@pytest.mark.parametrize(
    "backend",
    [
        "aot_eager",
        pytest.param(
            "inductor",
            marks=pytest.mark.skipif(
                not os.environ.get("INDUCTOR_TESTS"),
                reason="inductor compiles C++ for a minute of CPU; set INDUCTOR_TESTS=1",
            ),
        ),
    ],
)
def test_compiled_training_matches_eager_and_checkpoints_load_uncompiled(backend, monkeypatch):
    """A few AdamW steps on batches of changing shapes: torch.compile (dynamic shapes, no
    recompile per shape) gives the eager losses, and its weights load into an uncompiled model.
    aot_eager traces the same graphs, forward and backward, as inductor, without generating code."""
    if backend == "inductor" and shutil.which(os.environ.get("CXX", "g++")) is None:
        pytest.skip("torch.compile's CPU backend (inductor) needs a C++ compiler; none found")
    monkeypatch.setattr(torch, "compile", partial(torch.compile, backend=backend))
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    cfg = {**TINY, "num_encoder_layers": 1, "num_decoder_layers": 1}  # tracing time is per layer
    eager = TranslationModule(cfg)
    compiled = TranslationModule(cfg, compile_model=True)
    compiled.load_state_dict(eager.state_dict())
    shapes = [[(5, 2), (3, 9)], [(4, 4), (6, 3), (2, 7)], [(7, 8), (3, 3)]]
    losses = {}
    for name, module in (("eager", eager), ("compiled", compiled)):
        opt = torch.optim.AdamW(module.parameters(), lr=1e-2)
        losses[name] = []
        with torch._dynamo.config.patch(error_on_recompile=True):
            for i, lengths in enumerate(shapes):
                loss, _, n = module._loss(padded_batch(lengths, seed=i))
                opt.zero_grad()
                (loss / n).backward()
                opt.step()
                losses[name].append((loss / n).item())
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1  # one graph, 3 shapes
    assert losses["compiled"] == pytest.approx(losses["eager"], abs=1e-4)
    state = compiled.state_dict()
    assert state.keys() == eager.state_dict().keys()
    assert not any("_orig_mod" in k for k in state)
    ckpt = {"state_dict": state, "hyper_parameters": {"model": compiled.cfg.to_dict()}}
    model = model_from_checkpoint(ckpt)  # strict load into a plain Transformer
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, state[f"model.{name}"], rtol=0, atol=0)


@pytest.mark.parametrize(
    "decoding, message",
    [
        ({"strategy": "sample"}, r"validation\.decoding\.strategy='sample'; choose one of"),
        ({"strategy": "beam", "beam_size": 0}, r"validation\.decoding\.beam_size must be >= 1"),
        ({"len_penalty": "long"}, r"validation\.decoding\.len_penalty must be a number"),
        ({"max_len_b": -1}, r"validation\.decoding\.max_len_b must be >= 0"),
    ],
)
def test_module_rejects_bad_validation_decoding_naming_the_option(decoding, message):
    with pytest.raises(ValueError, match=message):
        TranslationModule(TINY, decoding=decoding)


def test_gpu_random_state_resumes_on_a_machine_with_fewer_gpus(monkeypatch):
    """A checkpoint holds the random state of its process's own GPU; one written before that
    holds every visible GPU's, and resuming it where fewer GPUs exist restores this process's
    GPU only (``torch.cuda.set_rng_state_all`` would index a GPU that is not there)."""
    from transformer import checkpoints

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
