"""``nn.Linear`` that runs float32 on CPU through oneDNN's kernel.

PyTorch computes a float32 linear layer on CPU with MKL's sgemm. On AMD CPUs MKL takes a slower code
path: oneDNN's kernel, which PyTorch ships for the linear layers of compiled models
(``torch.ops.mkldnn._linear_pointwise``), is about twice as fast at decoding shapes
(docs/benchmarks.md#ctranslate2-against-our-decoder). In training it computes the output and the
input's gradient; the weight's gradient, a product over all the batch's tokens, stays with
``torch.mm``, which is the faster there. Training under autocast keeps ``F.linear`` and autocast's
dtype rules; so does anything being compiled (inductor picks its own kernels) and a PyTorch build
without that operator.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer import kernels


def _onednn_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


ONEDNN = _onednn_available()


def _onednn_linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def _takes_onednn(x: Tensor, weight: Tensor) -> bool:
    return (
        ONEDNN
        and kernels.cpu_kernels(x)
        and x.dtype == weight.dtype == torch.float32
        and weight.numel() > 0
        and not torch.compiler.is_compiling()
    )


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear`` where autograd records nothing (no gradients wanted, or inside an
    ``autograd.Function``): oneDNN's kernel for float32 on CPU. ``weight`` may be a transposed
    view (``w.t()`` computes ``x @ w``)."""
    if _takes_onednn(x, weight):
        return _onednn_linear(x, weight, bias)
    return F.linear(x, weight, bias)


class _OneDNNLinear(torch.autograd.Function):
    """x (..., in), weight (out, in), bias (out,) or None -> x @ weight.T + bias, and back."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return _onednn_linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, weight = ctx.saved_tensors
        want_x, want_w, want_b = ctx.needs_input_grad
        grad_x = _onednn_linear(grad, weight.t(), None) if want_x else None
        grad_2d = grad.reshape(-1, grad.size(-1))  # (N, out)
        grad_w = grad_2d.t() @ x.reshape(-1, x.size(-1)) if want_w else None  # (out, in)
        grad_b = grad_2d.sum(0) if want_b and ctx.has_bias else None
        return grad_x, grad_w, grad_b


def linear_layer(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear``, recording autograd: oneDNN's kernel for float32 on CPU (:class:`Linear`)."""
    if not _takes_onednn(x, weight):
        return F.linear(x, weight, bias)
    if not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)):
        return _onednn_linear(x, weight, bias)  # float32 inputs: inference
    if torch.is_autocast_enabled("cpu"):
        return F.linear(x, weight, bias)  # autocast's dtype rules
    return _OneDNNLinear.apply(x, weight, bias)


class Linear(nn.Linear):
    """``nn.Linear`` (the same parameters and state dict), oneDNN for float32 on CPU."""

    def forward(self, x: Tensor) -> Tensor:
        return linear_layer(x, self.weight, self.bias)
