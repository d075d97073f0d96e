"""The teacher-forced forward pass of a training step, and how ``torch.compile`` compiles it:
whole (``compile=true``) or a layer at a time (``compile=layers``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor
from torch.func import functional_call

from transformer.model import Transformer


def hidden_states(
    model: Transformer,
    src: Tensor,
    tgt_in: Tensor,
    src_pad_mask: Tensor,
    weights: dict[str, Tensor] | None = None,
) -> Tensor:
    """Teacher-forced decoder states (B, T, D): the part of a step that ``torch.compile`` takes.
    ``weights``: tensors to run the model on in place of its parameters of those names (the
    autocast copies of :class:`transformer.precision.AutocastWeights`)."""
    if weights:
        args, kwargs = (src, tgt_in, src_pad_mask), {"return_hidden": True}
        return functional_call(model, weights, args, kwargs, tie_weights=False)
    return model(src, tgt_in, src_pad_mask, return_hidden=True)


def compile_options(backend: str, buckets: int, device_type: str) -> dict[str, Any]:
    """``torch.compile``'s arguments for the training step. Without shape buckets, dynamic
    shapes: one graph for batches of every shape. With ``buckets`` (``data.num_buckets``), static
    shapes, one graph a bucket, and inductor on CUDA replays them as CUDA graphs
    (``mode="reduce-overhead"``: a step's kernels launched at once, not one by one)."""
    options: dict[str, Any] = {"backend": backend, "dynamic": not buckets}
    if buckets and backend == "inductor" and device_type == "cuda":
        options["mode"] = "reduce-overhead"
    return options


def compiled_hidden_states(backend: str, buckets: int, device_type: str) -> Callable[..., Tensor]:
    """:func:`hidden_states` compiled with :func:`compile_options`, allowed a graph a bucket. A
    compiled function, not a compiled module: nothing is registered under a new name (no
    ``_orig_mod.`` in the state dict), and it always runs the model it is given."""
    options = compile_options(backend, buckets, device_type)
    dynamo = torch._dynamo.config  # its default allows 8 graphs a function
    dynamo.recompile_limit = max(dynamo.recompile_limit, buckets)
    return torch.compile(hidden_states, **options)


class CompiledLayers:
    """Regional compilation (``compile=layers``): each encoder and decoder layer's forward
    compiled on its own, with dynamic shapes, the layers of a stack sharing one graph (their code
    is the same; their weights are the graph's inputs). Inside a layer the compiler fuses what
    lies between its matrix products and attention: the residual adds, dropout and the next
    layer norm, the activation. Entered for a training step only (:meth:`__call__`): validation,
    decoding and attention capture run the layers as they are."""

    def __init__(self, model: Transformer, backend: str) -> None:
        layers = [*model.encoder.layers, *model.decoder.layers]
        self.forwards = {
            layer: torch.compile(layer.forward, backend=backend, dynamic=True) for layer in layers
        }

    @contextmanager
    def __call__(self) -> Iterator[None]:
        for layer, forward in self.forwards.items():
            layer.forward = forward
        try:
            yield
        finally:
            for layer in self.forwards:
                del layer.forward  # the class's again
