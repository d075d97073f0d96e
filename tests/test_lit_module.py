"""The Lightning module: compiled training equals eager, its checkpoints load uncompiled, and bad
validation decoding options are named."""

from __future__ import annotations

import os
import shutil
from functools import partial

import pytest
import torch

from tests.tiny import padded_batch, tiny_model_config
from transformer.checkpoints import model_from_checkpoint
from transformer.lit_module import TranslationModule


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
    layers = dict(num_encoder_layers=1, num_decoder_layers=1)  # tracing time is per layer
    cfg = tiny_model_config(20, dropout=0.0, **layers)
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
        TranslationModule(tiny_model_config(20), decoding=decoding)
