"""Dropout with a cheaper random mask on CPU.

PyTorch's CPU dropout draws its mask with ``bernoulli_``, one random number per element, a visible
share of a bf16 training step on CPU
(docs/benchmarks.md#the-loss-fused-with-the-output-projection-and-16-bit-dropout-masks). Here each
element reads 16 random bits instead: one 64-bit draw of ``random_`` serves four elements, and an
element is dropped when its 16 bits fall below ``p * 2**16``. The drop probability is thus ``p``
rounded to a multiple of 1/65536, p' (0.1 -> 0.100006), and kept elements are scaled by
``1 / (1 - p')``: the expected output is the input. On other devices, for ``p`` of 0 or 1, and while
compiling (the compiler draws its own masks; it cannot trace ``random_``), this is ``F.dropout``.
Both draw from torch's default generator, so seeding and checkpointed RNG states cover them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

_LEVELS = 1 << 16  # an element's mask comes from 16 random bits


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """``F.dropout(x, p, training)`` with a 16-bit mask on CPU (see the module's docstring)."""
    if not training or p == 0.0:
        return x
    dropped = round(p * _LEVELS)  # of the 2**16 values 16 bits can take
    if x.device.type != "cpu" or dropped == _LEVELS or torch.compiler.is_compiling():
        return F.dropout(x, p, training)
    n = x.numel()
    # All 64 bits random (a bare random_() leaves the sign bit 0), 4 x 16 bits per draw.
    bits = torch.empty((n + 3) // 4, dtype=torch.int64).random_(-(2**63), None)
    bits = bits.view(torch.int16)[:n].view(x.shape)  # uniform over [-2**15, 2**15)
    keep = bits >= dropped - _LEVELS // 2
    return x * keep.to(x.dtype).mul_(_LEVELS / (_LEVELS - dropped))


class Dropout(nn.Module):
    """``nn.Dropout`` backed by :func:`dropout`."""

    def __init__(self, p: float) -> None:
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability must be in [0, 1], got {p}")
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"
