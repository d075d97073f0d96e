"""The Lightning module: compiled training equals eager, compiles once per shape bucket, its
checkpoints load uncompiled, and bad validation decoding options are named."""

from __future__ import annotations

import os
import shutil

import lightning as L
import numpy as np
import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

from tests.tiny import padded_batch, tiny_model_config
from transformer.checkpoints import model_from_checkpoint
from transformer.data.collate import Buckets, Collator
from transformer.lit_module import TranslationModule, compile_options


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
def test_compiled_training_matches_eager_and_checkpoints_load_uncompiled(backend):
    """A few AdamW steps on batches of changing shapes: torch.compile (dynamic shapes, no
    recompile per shape) gives the eager losses, and its weights load into an uncompiled model.
    aot_eager traces the same graphs, forward and backward, as inductor, without generating code."""
    if backend == "inductor" and shutil.which(os.environ.get("CXX", "g++")) is None:
        pytest.skip("torch.compile's CPU backend (inductor) needs a C++ compiler; none found")
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    layers = dict(num_encoder_layers=1, num_decoder_layers=1)  # tracing time is per layer
    cfg = tiny_model_config(20, dropout=0.0, **layers)
    eager = TranslationModule(cfg)
    compiled = TranslationModule(cfg, compile_model=True, compile_backend=backend)
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
        TranslationModule(tiny_model_config(20), decoding=decoding)


def bucketed_batch(lengths: list[tuple[int, int]], buckets: Buckets | None, seed: int = 0):
    """:func:`padded_batch`'s pairs, padded to their bucket's shape (None: to their own)."""
    rng = np.random.default_rng(seed)
    pairs = [
        (i, rng.integers(4, 20, s), rng.integers(4, 20, t)) for i, (s, t) in enumerate(lengths)
    ]
    return Collator(buckets=buckets)(pairs)


def test_padding_a_batch_to_its_bucket_changes_neither_loss_nor_gradients():
    """Rows padded to the bucket's length and all-padding rows added: the same loss sum, label
    count and gradients as the batch padded to its own longest sentence (dropout off: its masks
    follow the shape)."""
    lengths = [(5, 2), (3, 9), (7, 4)]
    plain, padded = bucketed_batch(lengths, None), bucketed_batch(lengths, Buckets((16,), 96))
    assert plain.src.shape == (3, 8) and padded.src.shape == padded.tgt_in.shape == (6, 16)
    module = TranslationModule(tiny_model_config(20, dropout=0.0)).train()
    results = []
    for batch in (plain, padded):
        module.zero_grad(set_to_none=True)
        loss, nll, n = module._loss(batch)
        (loss / n).backward()
        results.append([loss, nll, n, *(p.grad for p in module.parameters())])
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want)


def test_the_compiled_step_compiles_once_per_bucket_with_no_graph_break():
    """Training steps (bf16 autocast, dropout on) on bucketed batches of six raw shapes in two
    buckets: two graphs with static shapes and no graph break; a validation step between them
    runs eagerly, compiling nothing, and the training graphs are not compiled again after it."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    counter = CompileCounterWithBackend("aot_eager")
    layers = dict(num_encoder_layers=1, num_decoder_layers=1)  # tracing time is per layer
    cfg = tiny_model_config(20, dropout=0.1, **layers)
    module = TranslationModule(cfg, compile_model=True, compile_backend=counter, shape_buckets=2)
    module.trainer = L.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False)
    module.val_bleu_sentences = 0  # the validation loss alone
    buckets = Buckets((8, 16), max_tokens=64)
    steps = [[(3, 5), (6, 2)], [(10, 4), (7, 12)], [(2, 2)], "validation", [(14, 3)], [(4, 6)]]
    graphs = []
    for i, lengths in enumerate(steps):
        if lengths == "validation":
            module.eval()
            module.on_validation_epoch_start()
            with torch.no_grad():
                module.validation_step(bucketed_batch([(9, 3), (2, 11)], buckets), 0)
            module.train()
        else:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss, _, n = module._loss(bucketed_batch(lengths, buckets, seed=i))
            (loss / n).backward()
        graphs.append(counter.frame_count)
    assert graphs == [1, 2, 2, 2, 2, 2]
    assert not torch._dynamo.utils.counters["graph_break"]


def test_compile_options_make_bucketed_steps_static_and_cuda_graphs_on_cuda():
    assert compile_options("inductor", 0, "cuda") == {"backend": "inductor", "dynamic": True}
    static = {"backend": "inductor", "dynamic": False}
    assert compile_options("inductor", 4, "cpu") == static  # no CUDA graphs off CUDA
    assert compile_options("inductor", 4, "cuda") == {**static, "mode": "reduce-overhead"}
    assert compile_options("aot_eager", 4, "cuda") == {"backend": "aot_eager", "dynamic": False}
