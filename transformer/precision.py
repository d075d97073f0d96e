"""Mixed precision: the dtype products run in, and linear weights cast for autocast once a step.

Under autocast each linear layer casts its float32 weight and bias to the autocast dtype when it
is called, and autograd casts their gradients back: a kernel per tensor each way, 266 a training
step of transformer-base. :class:`AutocastWeights` casts them all with one multi-tensor copy
(``torch._foreach_copy_``, on CUDA a few kernel launches for all of them) and casts all their
gradients back with another; the model runs on the copies (``torch.func.functional_call``), and
autocast finds nothing left to cast. The copies hold autocast's own numbers (the same rounding),
so the products and the gradients are the same too.
"""

from __future__ import annotations

import functools
import math
import time

import torch
from torch import Tensor, nn


def cuda_has_bf16() -> bool:
    """Whether the CUDA GPU computes bf16 natively (compute capability 8.0 and up, e.g. A100,
    H100). Older ones (V100, T4) only emulate it, slowly: ``torch.cuda.is_bf16_supported()``
    says True there by default, so ``auto`` precision asks without emulation."""
    return torch.cuda.is_bf16_supported(including_emulation=False)


BF16_MIN_SPEEDUP = 1.25  # bf16 products this many times float32's speed: ``auto`` picks bf16-mixed


def cpu_matmul_seconds(
    dtypes: tuple[torch.dtype, ...], n: int = 2048, repeats: int = 2
) -> dict[torch.dtype, float]:
    """{dtype: the best of ``repeats`` + 1 timings (the first warms up) of an n x n matrix
    product in it}, on the CPU with torch's threads, the dtypes interleaved."""
    x = {dtype: torch.randn(n, n).to(dtype) for dtype in dtypes}
    best = dict.fromkeys(x, math.inf)
    for _ in range(repeats + 1):
        for dtype, a in x.items():
            start = time.perf_counter()
            torch.mm(a, a)
            best[dtype] = min(best[dtype], time.perf_counter() - start)
    return best


@functools.cache
def cpu_bf16_speedup(n: int = 2048, repeats: int = 2) -> float | None:
    """How many times float32's speed this CPU multiplies two n x n bf16 matrices at
    (:func:`cpu_matmul_seconds`); None where it has no bf16 instructions (AVX512-BF16 or AMX),
    where oneDNN emulates bf16, slowly. Measured once a process. The instructions do not settle
    it: with AVX512-BF16 and no AMX some CPUs multiply bf16 faster than float32, others slower
    (docs/training.md)."""
    if not (torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()):
        return None
    seconds = cpu_matmul_seconds((torch.float32, torch.bfloat16), n, repeats)
    return seconds[torch.float32] / seconds[torch.bfloat16]


def compute_dtype(x: Tensor) -> torch.dtype:
    """The dtype products of activations like ``x`` run in: autocast's where it is on for x's
    device, else x's own."""
    device = x.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype


def _copies(tensors: tuple[Tensor, ...], dtypes: list[torch.dtype]) -> tuple[Tensor, ...]:
    out = [torch.empty_like(t, dtype=d) for t, d in zip(tensors, dtypes, strict=True)]
    torch._foreach_copy_(out, tensors)
    return tuple(out)


class _CastAll(torch.autograd.Function):
    """tensors -> their copies in ``dtype``; gradients -> each tensor's dtype: one copy each way."""

    @staticmethod
    def forward(ctx, dtype: torch.dtype, *tensors: Tensor) -> tuple[Tensor, ...]:
        ctx.dtypes = [t.dtype for t in tensors]
        return _copies(tensors, [dtype] * len(tensors))

    @staticmethod
    def backward(ctx, *grads: Tensor):
        return None, *_copies(grads, ctx.dtypes)


class AutocastWeights:
    """The weights and biases of a model's linear layers (``nn.Linear``), cast for autocast."""

    def __init__(self, model: nn.Module) -> None:
        self.tensors = [
            (f"{name}.{attr}", module, attr)
            for name, module in model.named_modules()
            if isinstance(module, nn.Linear)
            for attr in ("weight", "bias")
            if getattr(module, attr) is not None
        ]

    def __call__(self) -> dict[str, Tensor]:
        """{parameter name: its copy in the autocast dtype}, for the floating-point tensors of
        another dtype; {} where autocast is off on their device."""
        if not self.tensors:
            return {}
        device = getattr(self.tensors[0][1], self.tensors[0][2]).device.type
        if not torch.is_autocast_enabled(device):
            return {}
        dtype = torch.get_autocast_dtype(device)
        named = [(name, getattr(module, attr)) for name, module, attr in self.tensors]
        named = [(n, t) for n, t in named if t.is_floating_point() and t.dtype != dtype]
        if not named:
            return {}
        names, tensors = zip(*named, strict=True)
        return dict(zip(names, _CastAll.apply(dtype, *tensors), strict=True))
