"""How decoding runs on its device: how often the host reads it (``sync_every``), the batch sizes
sentences decode in, whether steps replay CUDA graphs and whether the whole search step runs at
static shapes, the attention kernel of a step, and the line that says all of it."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import torch
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

from transformer import kernels
from transformer.decoding.options import DecodeOptions
from transformer.errors import ConfigError


def sync_interval(options: DecodeOptions, src: Tensor) -> int:
    """Steps between the host's reads of how many sentences are done (``sync_every``; 0: every
    step on the CPU, where a read costs nothing and a finished sentence should leave at once;
    every 8 steps elsewhere, where each read waits for the device)."""
    if options.sync_every:
        return options.sync_every
    return 1 if kernels.cpu_kernels(src) else 8


def batch_size(live: int, every: int) -> int:
    """The rows ``live`` sentences decode in: ``live`` when the host reads every step; else the
    smallest of 1..8 and 2**e x (1, 1.25, 1.5, 1.75) that holds them, so that the same few sizes
    (each its CUDA graph) come back step after step, at most 25% of rows spare."""
    if every == 1 or live <= 8:
        return live
    quarter = 2 ** (live.bit_length() - 1) // 4
    return -(-live // quarter) * quarter


def use_graphs(options: DecodeOptions, device: torch.device) -> bool:
    """Whether cached steps replay CUDA graphs: ``options.graphs``, or (None) on a GPU, outside
    autocast (whose weight casts a graph would freeze)."""
    if options.graphs is not None and options.graphs and device.type != "cuda":
        raise ConfigError(
            "decode.graphs=true: CUDA graphs need a GPU; set it to null (on a GPU only) or false"
        )
    if torch.is_autocast_enabled(device.type):
        return False
    return device.type == "cuda" if options.graphs is None else options.graphs


def use_static_search(options: DecodeOptions, device: torch.device, use_cache: bool) -> bool:
    """Whether the whole search step, model and search, runs at static shapes
    (:mod:`transformer.decoding.static`): ``options.static_search`` (a CUDA graph where
    :func:`use_graphs`, eagerly elsewhere). Never uncached (whose shapes grow each step): that
    search runs today's loop."""
    return use_cache and options.static_search


def backend(x: Tensor, dtype: torch.dtype, graphs: bool, whole_step: bool = False) -> str:
    """How a cached step runs on ``x``'s device with weights of ``dtype`` (``whole_step``: in
    the whole search step at static shapes, :mod:`transformer.decoding.static`): logged once
    (debug), recorded in evaluate.py's metrics.json, printed by bench_decode."""
    name = f"decoding on {x.device.type} in {str(dtype).removeprefix('torch.')}"
    search = ", the whole search step at static shapes" if whole_step else ""
    if kernels.cpu_kernels(x):
        return f"{name}: oneDNN linear layers, attention steps as two batched products{search}"
    return (
        f"{name}: SDPA's memory-efficient attention kernel (flash where it takes the call), "
        f"static shapes, CUDA graphs {'on' if graphs else 'off'}{search}"
    )


def attention_kernel(x: Tensor) -> AbstractContextManager:
    """The attention kernel of a decoding step off the CPU, chosen here rather than per shape:
    SDPA's memory-efficient kernel, which takes additive masks in float32, bf16 and fp16; flash
    (no mask, no float32: a cross-attention step without source padding, in half precision; and
    the fused CPU kernel), then the math kernel. Not cuDNN's, which builds a plan per shape."""
    if kernels.cpu_kernels(x):
        return nullcontext()
    backends = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]
    return sdpa_kernel(backends, set_priority=True)
