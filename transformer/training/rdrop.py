"""R-Drop (Liang et al. 2021, ``loss.rdrop_alpha``): the label-smoothed loss of two passes with
their own dropout plus their symmetric KL divergence, fused with the output projection in chunks
as the training loss is (:mod:`transformer.training.loss`): both passes' logits of a chunk,
never the batch's."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from transformer.linear import linear
from transformer.training.loss import (
    apply_in_chunks,
    keep_for_backward,
    non_pad,
    saved_gradients,
    sums_and_gradients,
    with_bias,
)


class _ProjectedRDropLoss(torch.autograd.Function):
    """hidden (2, N, D): two passes' states at the same positions, weight (V, D), labels (N,) ->
    summed R-Drop loss and summed NLL (mean of the two passes).

    Per label: ``(ce_1 + ce_2) / 2 + alpha / 4 * (KL(p_1 || p_2) + KL(p_2 || p_1))``, where
    ``KL(p_1 || p_2) + KL(p_2 || p_1) = sum_v (p_1 - p_2)(log p_1 - log p_2)``. Its gradient with
    respect to pass 1's logits: ``(p_1 - target) / 2 + alpha / 4 * (p_1 (d - E_p1[d]) + p_1 -
    p_2)`` with ``d = log p_1 - log p_2`` (pass 2's: the same with 1 and 2 swapped). As in
    :class:`transformer.training.loss._ProjectedLoss` the gradients are computed in the forward.
    """

    @staticmethod
    def forward(ctx, hidden, weight, labels, epsilon: float, alpha: float, rows: int, want_grad):
        n, vocab = hidden.size(1), weight.size(0)
        loss, nll, grad_hidden, grad_weight = sums_and_gradients(hidden, weight, want_grad)
        for start in range(0, n, rows):
            h = hidden[:, start : start + rows]  # (2, C, D)
            y = labels[start : start + rows, None]  # (C, 1)
            lp = F.log_softmax(linear(h, weight), dim=-1, dtype=torch.float32)  # (2, C, V)
            token_nll = -lp.gather(2, y.expand(2, -1, -1))  # (2, C, 1)
            ce = (1.0 - epsilon) * token_nll.sum() - epsilon * lp.mean(-1).sum()
            p = lp.exp()  # (2, C, V)
            d = lp[0] - lp[1]  # (C, V)
            loss += 0.5 * ce + 0.25 * alpha * ((p[0] - p[1]) * d).sum()
            nll += 0.5 * token_nll.sum()
            if not want_grad:
                continue
            target = torch.full_like(d, epsilon / vocab).scatter_add_(
                1, y, d.new_full(y.shape, 1.0 - epsilon)
            )  # (C, V)
            for k, sign in ((0, 1.0), (1, -1.0)):  # d log p_k / ... : d for pass 1, -d for 2
                dk = sign * d
                kl = p[k] * (dk - (p[k] * dk).sum(-1, keepdim=True)) + p[k] - p[1 - k]
                g = (0.5 * (p[k] - target) + 0.25 * alpha * kl).to(hidden.dtype)  # (C, V)
                grad_hidden[k, start : start + rows] = linear(g, weight.t())  # (C, D)
                grad_weight += g.T @ h[k]  # (V, D)
        keep_for_backward(ctx, grad_hidden, grad_weight, weight, nll)
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_nll: Tensor):
        return *saved_gradients(ctx, grad_loss), None, None, None, None, None


def rdrop_loss(
    hidden: Tensor,
    weight: Tensor,
    labels: Tensor,
    epsilon: float,
    alpha: float,
    pad_id: int,
    num_labels: int | None = None,
    bias: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """R-Drop (Liang et al. 2021): the label-smoothed loss of two passes with their own dropout,
    plus ``alpha`` times their symmetric KL divergence, summed over the non-pad labels; the
    summed NLL (mean of the passes) and the label count.

    hidden (2, ..., D): the two passes' decoder states for the same batch (one pass over the
    batch doubled), labels (...). Per label the loss is ``(ce_1 + ce_2) / 2 + alpha / 4 *
    (KL(p_1 || p_2) + KL(p_2 || p_1))``: the paper's loss (the sum of both passes' cross
    entropies plus ``alpha / 2`` times that sum of KLs) halved, so ``alpha`` means what it does
    there (5 for its translation tasks). Label smoothing applies to the cross entropies only.
    Projected and fused in chunks as :func:`transformer.training.loss.label_smoothed_loss`,
    ``bias`` too.
    """
    hidden, weight, labels, keep = non_pad(hidden, weight, labels, pad_id, num_labels, passes=1)
    hidden, weight = with_bias(hidden, weight, bias)
    loss, nll = apply_in_chunks(
        _ProjectedRDropLoss, hidden, weight, labels, epsilon, alpha, num_passes=2
    )
    return loss, nll, keep.sum()
