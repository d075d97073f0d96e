"""Label-smoothed cross entropy fused with the output projection, in chunks of tokens.

The training loss never materialises the (tokens, vocabulary) logits: for each chunk of non-pad
decoder states it projects to logits, takes the loss and, when gradients are wanted, the gradient
of the loss with respect to those logits (softmax minus the smoothed target), and turns it at once
into the gradients of the states and of the projection matrix. Memory for logits is one chunk's
instead of the batch's, and each chunk's elementwise work stays in cache. What it saves per training
step: docs/benchmarks.md#the-loss-fused-with-the-output-projection-and-16-bit-dropout-masks. R-Drop
(:func:`transformer.training.rdrop.rdrop_loss`) is fused the same way: both passes' logits of a
chunk, never the batch's. On CPU the products with the projection matrix run through oneDNN in
float32 (:func:`transformer.linear.linear`).

Two fused kernels may take a chunk's elementwise work instead (``loss.kernel``,
:data:`LOSS_KERNELS`): ``compiled``, the same chunk's log-softmax, loss and gradient compiled by
``torch.compile`` (on CUDA a few Triton kernels that read the bf16 logits and write the bf16
gradient, with no float32 (chunk, vocabulary) tensor between); and on CUDA ``liger``,
Liger-Kernel's fused linear cross entropy (its own chunks and Triton kernel; it gives no NLL and
counts the labels on the host, a device sync a step). Both are for the label-smoothed loss of
training steps; R-Drop and validation run the chunked loss.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from transformer.linear import linear

# Logit entries per chunk: 16 MB of float32 logits on CPU (cache-sized work); on GPUs 256 MB, so
# that a 32k vocabulary still makes chunks of 2k tokens (a few kernel launches per 2k tokens).
CHUNK_ELEMENTS = {"cpu": 1 << 22, "cuda": 1 << 26}

# loss.kernel: auto = the fastest measured on the device (today the chunked loss on CPU and CUDA
# alike: the GPU check's step stage compares them); chunked: the loop of this module, eagerly;
# compiled and liger: fused on CUDA (the module docstring)
LOSS_KERNELS = ("auto", "chunked", "compiled", "liger")


def check_label_smoothing(eps: float, name: str = "label_smoothing") -> float:
    """The label smoothing epsilon, in [0, 1); the message calls it ``name``. ``train`` checks
    ``loss.label_smoothing`` here before any data work."""
    if not 0.0 <= eps < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {eps}")
    return eps


def saved_gradients(ctx, grad_loss: Tensor) -> tuple[Tensor, Tensor]:
    """The hidden states' and the projection's gradients, computed in the forward, scaled by the
    loss's incoming gradient (the loss is a sum: its backward only scales them)."""
    grad_hidden, grad_weight = ctx.saved_tensors
    return grad_hidden * grad_loss.to(grad_hidden.dtype), grad_weight * grad_loss.to(
        grad_weight.dtype
    )


def sums_and_gradients(
    hidden: Tensor, weight: Tensor, want_grad: bool
) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
    """A forward's accumulators: the loss and NLL sums (float32 scalars) and, when gradients are
    wanted, the states' gradient (as ``hidden``, filled chunk by chunk) and the projection's
    (float32, summed over chunks)."""
    loss = hidden.new_zeros((), dtype=torch.float32)
    nll = hidden.new_zeros((), dtype=torch.float32)
    grad_hidden = torch.empty_like(hidden) if want_grad else None
    grad_weight = torch.zeros_like(weight, dtype=torch.float32) if want_grad else None
    return loss, nll, grad_hidden, grad_weight


def keep_for_backward(
    ctx, grad_hidden: Tensor | None, grad_weight: Tensor | None, weight: Tensor, nll: Tensor
) -> None:
    """Keep the gradients computed in the forward for the backward (the projection's in its
    dtype); the NLL carries none."""
    if grad_hidden is not None:
        ctx.save_for_backward(grad_hidden, grad_weight.to(weight.dtype))
    ctx.mark_non_differentiable(nll)


def apply_in_chunks(
    function: type[torch.autograd.Function],
    hidden: Tensor,
    weight: Tensor,
    labels: Tensor,
    *args: float,
    num_passes: int,
) -> tuple[Tensor, Tensor]:
    """``function`` (a projected loss) on the non-pad states, outside autocast, in chunks of as
    many positions as make :data:`CHUNK_ELEMENTS` logit entries (``num_passes`` rows of logits a
    position)."""
    device = hidden.device.type
    per_row = num_passes * weight.size(0)
    rows = max(1, CHUNK_ELEMENTS.get(device, CHUNK_ELEMENTS["cuda"]) // per_row)
    want_grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    with torch.autocast(device, enabled=False):
        return function.apply(hidden, weight, labels, *args, rows, want_grad)


class _ProjectedLoss(torch.autograd.Function):
    """hidden (N, D), weight (V, D), labels (N,) -> summed smoothed loss and summed NLL.

    The gradients are computed in the forward (the loss is a sum, so its backward only scales
    them); the NLL is for reporting and carries no gradient.
    """

    @staticmethod
    def forward(
        ctx,
        hidden: Tensor,
        weight: Tensor,
        labels: Tensor,
        epsilon: float,
        compiled: bool,
        rows: int,
        want_grad: bool,
    ):
        n, vocab = hidden.size(0), weight.size(0)
        loss, nll, grad_hidden, grad_weight = sums_and_gradients(hidden, weight, want_grad)
        terms = _compiled_terms() if compiled else _chunk_terms
        for start in range(0, n, rows):
            h = hidden[start : start + rows]  # (C, D)
            y = labels[start : start + rows, None]  # (C, 1)
            chunk_loss, chunk_nll, g = terms(linear(h, weight), y, epsilon, vocab, want_grad)
            loss += chunk_loss
            nll += chunk_nll
            if want_grad:
                grad_hidden[start : start + rows] = linear(g, weight.t())  # (C, D)
                grad_weight += g.T @ h  # (V, D), summed over chunks in float32
        keep_for_backward(ctx, grad_hidden, grad_weight, weight, nll)
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_nll: Tensor):
        return *saved_gradients(ctx, grad_loss), None, None, None, None, None


def _chunk_terms(
    logits: Tensor, y: Tensor, epsilon: float, vocab: int, want_grad: bool
) -> tuple[Tensor, Tensor, Tensor | None]:
    """A chunk's summed smoothed loss and summed NLL (float32), and when gradients are wanted the
    loss's gradient with respect to its logits (C, V), in the logits' dtype: softmax minus
    ``(1 - eps) one-hot + eps / V``. logits (C, V), y (C, 1)."""
    lprobs = F.log_softmax(logits, dim=-1, dtype=torch.float32)  # (C, V)
    token_nll = -lprobs.gather(1, y)  # (C, 1)
    loss = (1.0 - epsilon) * token_nll.sum() - epsilon * lprobs.mean(-1).sum()
    if not want_grad:
        return loss, token_nll.sum(), None
    g = lprobs.exp_().sub_(epsilon / vocab)
    g.scatter_add_(1, y, g.new_full(y.shape, epsilon - 1.0))
    return loss, token_nll.sum(), g.to(logits.dtype)


@functools.cache
def _compiled_terms() -> Callable[..., tuple[Tensor, Tensor, Tensor | None]]:
    """:func:`_chunk_terms` compiled (``loss.kernel=compiled``): one graph for chunks of every
    length, the constants (epsilon, the vocabulary) specialised."""
    return torch.compile(_chunk_terms, dynamic=True)


def _liger_loss(hidden: Tensor, weight: Tensor, labels: Tensor, epsilon: float) -> Tensor:
    """Liger-Kernel's fused linear cross entropy (``loss.kernel=liger``): the summed smoothed
    loss over hidden (N, D) @ weight (V, D).T and labels (N,), the gradients in float32 sums."""
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    return liger_fused_linear_cross_entropy(
        hidden, weight, labels, label_smoothing=epsilon, reduction="sum",
        accum_dtype=torch.float32,
    )  # fmt: skip


def non_pad(
    hidden: Tensor, weight: Tensor, labels: Tensor, pad_id: int, num_labels: int | None, passes: int
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The states (N, D), or (2, N, D) with ``passes=1`` leading dimension, and labels (N,) at the
    non-pad positions; states and weight in the autocast dtype under autocast; the non-pad mask
    (B*T,). ``num_labels`` (the non-pad count, known on the host) spares a device sync."""
    keep = labels.flatten().ne(pad_id)  # (B*T,)
    if num_labels is None:
        idx = keep.nonzero().squeeze(1)  # (N,)
    else:
        idx = keep.nonzero_static(size=num_labels).squeeze(1)  # (N,)
    hidden = hidden.flatten(passes, -2).index_select(passes, idx)
    device = hidden.device.type
    if torch.is_autocast_enabled(device):
        hidden = hidden.to(torch.get_autocast_dtype(device))
    return hidden, weight.to(hidden.dtype), labels.flatten().index_select(0, idx), keep


def with_bias(hidden: Tensor, weight: Tensor, bias: Tensor | None) -> tuple[Tensor, Tensor]:
    """A projection with a bias as one without: a column of ones after the states (..., D + 1)
    and the bias after the weight's columns (V, D + 1), whose products are ``hidden @ weight.T +
    bias``; autograd takes each one's gradient back through the concatenations."""
    if bias is None:
        return hidden, weight
    ones = hidden.new_ones(*hidden.shape[:-1], 1)
    return torch.cat([hidden, ones], -1), torch.cat([weight, bias.to(weight.dtype)[:, None]], 1)


def label_smoothed_loss(
    hidden: Tensor,
    weight: Tensor,
    labels: Tensor,
    epsilon: float,
    pad_id: int,
    num_labels: int | None = None,
    kernel: str = "chunked",
    bias: Tensor | None = None,
) -> tuple[Tensor, Tensor | None, Tensor]:
    """Summed label-smoothed cross entropy and summed NLL over the non-pad labels, and their count.

    hidden (..., D) decoder states, weight (V, D) the output projection, labels (...): the loss of
    ``logits = hidden @ weight.T`` is ``(1 - eps) * nll + eps * mean over the vocabulary of
    -log p`` per label (torch's ``label_smoothing`` formula), with the NLL kept apart for
    perplexity; log-probabilities in float32 whatever the states' dtype. Under autocast the
    projection runs in the autocast dtype. Only non-pad positions are projected. ``num_labels``,
    the number of non-pad labels if the caller knows it on the host, spares a device sync. The
    count stays a tensor: reading it would wait for the device. ``kernel``: ``chunked`` (this
    module's loop), ``compiled`` or ``liger`` (CUDA; the module docstring); with ``liger`` the
    NLL is None. ``bias`` (V,): the output projection's, if it has one (:func:`with_bias`).
    """
    hidden, weight, labels, keep = non_pad(hidden, weight, labels, pad_id, num_labels, passes=0)
    hidden, weight = with_bias(hidden, weight, bias)
    if kernel == "liger":
        with torch.autocast(hidden.device.type, enabled=False):
            return _liger_loss(hidden, weight, labels, epsilon), None, keep.sum()
    compiled = kernel == "compiled"
    loss, nll = apply_in_chunks(
        _ProjectedLoss, hidden, weight, labels, epsilon, compiled, num_passes=1
    )
    return loss, nll, keep.sum()
