"""The Lightning module: compiled training (whole, or a layer at a time) equals eager, compiles
once per shape bucket, its checkpoints load uncompiled, bad validation decoding options are named,
and training waits for the device only where it logs."""

from __future__ import annotations

import dataclasses
import os
import shutil
import traceback
import weakref
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import Callback, WeightAveraging
from torch._dynamo.testing import CompileCounterWithBackend
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from bench.count_kernels import cuda_code_paths
from tests.tiny import compose_cfg, padded_batch, tiny_model_config, tiny_overrides
from transformer.checkpoints import model_from_checkpoint
from transformer.data.collate import Buckets, Collator
from transformer.training import TranslationModule, train
from transformer.training.step import compile_options


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
@pytest.mark.slow
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


@pytest.mark.slow
def test_layers_compiled_one_by_one_train_as_eager_and_validate_uncompiled():
    """compile=layers on batches of changing shapes, on CUDA's code paths under bf16 autocast as
    on a GPU (aot_eager traces the graphs inductor would compile): the eager losses and
    gradients; a graph for the encoder's layers and one for the decoder's, each compiled again at
    most once (when a mask's padded rows first change length: from then on dynamic), no graph
    break, no recompile for later shapes; after a step the layers run their own forward again
    (validation and decoding are never compiled)."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    cfg = tiny_model_config(20, dropout=0.0)  # 2+2 layers
    eager = TranslationModule(cfg)
    layered = TranslationModule(cfg, compile_model="layers", compile_backend="aot_eager")
    layered.load_state_dict(eager.state_dict())
    shapes = [[(5, 2), (3, 9)], [(4, 4), (6, 3), (2, 5)], [(9, 10), (3, 3)], [(20, 17), (12, 30)]]
    for i, lengths in enumerate(shapes):
        batch = padded_batch(lengths, seed=i)
        grads = []
        for module in (eager, layered):
            module.zero_grad(set_to_none=True)
            recompile = torch._dynamo.config.patch(error_on_recompile=i == len(shapes) - 1)
            with recompile, cuda_code_paths(), torch.autocast("cpu", dtype=torch.bfloat16):
                loss, nll, n = module._loss(batch)
            (loss / n).backward()
            grads.append([loss, nll, *(p.grad for p in module.parameters())])
        for got, want in zip(*grads[::-1], strict=True):
            torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-3)
    counters = torch._dynamo.utils.counters
    graphs = counters["stats"]["unique_graphs"]
    assert 2 <= graphs <= 4 and not counters["graph_break"], (graphs, counters["graph_break"])
    layer = layered.model.encoder.layers[0]
    assert "forward" not in vars(layer)  # the class's forward, outside a training step
    with torch._dynamo.config.patch(error_on_recompile=True), torch.no_grad():
        layered._loss(padded_batch([(4, 6)]), compiled=False)  # a validation step: eager
    assert counters["stats"]["unique_graphs"] == graphs


CUDA_FIELDS = ("src", "tgt_in", "labels", "src_pad_mask")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_layers_compiled_by_inductor_on_cuda_match_eager_in_bf16():
    """compile=layers with inductor on CUDA (the residual adds, dropout and layer norms fused):
    a bf16 step's loss and gradients equal the eager step's within bf16 rounding (dropout off:
    the compiled masks come from another generator)."""
    torch._dynamo.reset()
    cfg = tiny_model_config(64, dropout=0.0, d_model=128, d_ff=256)
    eager = TranslationModule(cfg).cuda()
    layered = TranslationModule(cfg, compile_model="layers").cuda()
    layered.load_state_dict(eager.state_dict())
    batch = padded_batch([(9, 7), (12, 14), (5, 11)], vocab=64)
    batch = dataclasses.replace(batch, **{f: getattr(batch, f).cuda() for f in CUDA_FIELDS})
    results = []
    for module in (eager, layered):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss, nll, n = module._loss(batch)
        (loss / n).backward()
        results.append([loss, *(p.grad for p in module.parameters())])
    for got, want in zip(results[1], results[0], strict=True):
        assert (got - want).norm() / want.norm().clamp(min=1e-6) < 2e-2


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


@pytest.mark.slow
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


# Device syncs: a GPU waits for its queue whenever the host reads a value computed there.


class DeviceReads(TorchDispatchMode):
    """Counts, per training step, the host's reads of values a GPU would hold (``item``,
    ``bool``, ``nonzero``, ``tolist``, ``numpy``, ``cpu``: on a GPU each waits for the device),
    on CPU: a tensor is "on the device" when it derives from the model's parameters or a batch
    (:meth:`seed`), followed through every op; reads of host values (the optimizer's step
    counts on CPU, the collator's counts, ``host_scalar``) are free on a GPU and not counted."""

    READS = ("_local_scalar_dense", "is_nonzero", "nonzero", "equal")

    def __init__(self) -> None:
        super().__init__()
        self.step: int | None = None
        self.reads: dict[int, list[str]] = {}
        self._device: dict[int, weakref.ref] = {}

    def seed(self, tensors) -> None:
        for t in tensors:
            if isinstance(t, torch.Tensor) and not self.on_device(t):
                key = id(t)
                self._device[key] = weakref.ref(t, lambda _, key=key: self._device.pop(key, None))

    def on_device(self, t: torch.Tensor) -> bool:
        ref = self._device.get(id(t))
        return ref is not None and ref() is t

    def read(self, what: str) -> None:
        if self.step is not None:
            frames = [f for f in traceback.extract_stack() if "/torch/" not in f.filename]
            where = " < ".join(f"{Path(f.filename).name}:{f.lineno}" for f in frames[-3:-1])
            self.reads.setdefault(self.step, []).append(f"{what} at {where}")

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        inputs = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        from_device = any(self.on_device(t) for t in inputs)
        if from_device and func.overloadpacket.__name__ in self.READS:
            self.read(func.overloadpacket.__name__)
        out = func(*args, **(kwargs or {}))
        if from_device:
            self.seed(pytree.tree_leaves(out))
        return out

    def watch_host_copies(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """``tolist``, ``numpy`` and ``cpu`` of a CPU tensor dispatch no op: wrap them."""
        for name in ("tolist", "numpy", "cpu"):
            method = getattr(torch.Tensor, name)

            def wrapper(t, *args, _method=method, _name=name, **kwargs):
                if self.on_device(t):
                    self.read(_name)
                return _method(t, *args, **kwargs)

            monkeypatch.setattr(torch.Tensor, name, wrapper)


class MarkSteps(Callback):
    """Tells :class:`DeviceReads` the step and what is on the device: parameters, batches."""

    spy: DeviceReads

    def on_fit_start(self, trainer, pl_module) -> None:
        self.spy.seed(pl_module.parameters())
        for callback in trainer.callbacks:  # the moving average of the weights, with its count
            if isinstance(callback, WeightAveraging):
                average = callback._average_model
                self.spy.seed([*average.parameters(), *average.buffers()])

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.spy.step = trainer.global_step
        self.spy.seed(vars(batch).values())


@pytest.mark.slow
@pytest.mark.parametrize("ema", [[], ["ema.decay=0.99"]], ids=["default", "ema"])
def test_training_reads_the_device_only_at_logging_steps(ema, corpus, tmp_path, monkeypatch):
    """With the GPU's defaults (fused AdamW, clipping, the progress bar on), and with the moving
    average of the weights, no training step waits for the device but those that log (every
    ``trainer.log_every_n_steps``: the loggers read the values there) and the first: no
    ``.item()`` a step for the progress bar, the NaN/inf flags, the average's count, or anything
    else."""
    spy = DeviceReads()
    spy.watch_host_copies(monkeypatch)
    monkeypatch.setattr(MarkSteps, "spy", spy, raising=False)
    overrides = [
        *tiny_overrides(corpus), "model.num_encoder_layers=1", "model.num_decoder_layers=1",
        "data.max_tokens=256", "trainer.enable_progress_bar=true", "trainer.max_steps=8",
        "trainer.log_every_n_steps=4", "trainer.limit_val_batches=0", "trainer.gradient_clip_val=1",
        "optim.optimizer.fused=true", f"+callbacks.mark._target_={__name__}.MarkSteps", *ema,
    ]  # fmt: skip
    with spy:
        train(compose_cfg(overrides, tmp_path))
    # Lightning logs after steps 4 and 8; the bar shows the first step's loss too
    assert spy.reads.keys() <= {0, 3, 7}, spy.reads
    assert spy.reads.get(3)  # the loggers' reads are seen
