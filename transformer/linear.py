"""``nn.Linear`` that runs float32 inference on CPU through oneDNN's kernel.

PyTorch computes a float32 linear layer on CPU with MKL's sgemm. On AMD CPUs MKL takes a slower
code path: oneDNN's kernel, which PyTorch ships for the linear layers of compiled models
(``torch.ops.mkldnn._linear_pointwise``), is about twice as fast at decoding shapes (BENCHMARKS.md,
"CTranslate2 against our decoder"). Only where nothing records gradients (decoding, validation,
evaluation) and nothing is being compiled; training keeps ``F.linear``, and so does any PyTorch
build without that operator.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def _onednn_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


ONEDNN = _onednn_available()


class Linear(nn.Linear):
    """``nn.Linear`` (the same parameters and state dict), oneDNN for float32 CPU inference."""

    def forward(self, x: Tensor) -> Tensor:
        if (
            ONEDNN
            and x.device.type == "cpu"
            and x.dtype == self.weight.dtype == torch.float32
            and self.weight.numel()
            and not torch.is_grad_enabled()
            and not torch.compiler.is_compiling()  # compiled: inductor picks its own kernels
        ):
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)
