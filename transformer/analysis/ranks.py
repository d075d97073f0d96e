"""Rank statistics: average ranks with ties, and Spearman's rank correlation."""

from __future__ import annotations

import torch
from torch import Tensor


def average_ranks(x: Tensor) -> Tensor:
    """(n,) values -> (n,) float64 ranks 1..n, tied values sharing the mean of their ranks."""
    order = x.argsort(stable=True)
    _, inverse, counts = torch.unique_consecutive(x[order], return_inverse=True, return_counts=True)
    ends = counts.cumsum(0).double()  # the last rank of each group of equal values
    ranks = torch.empty(len(x), dtype=torch.float64)
    ranks[order] = (ends - (counts - 1) / 2)[inverse]
    return ranks


def spearman(x: Tensor, y: Tensor) -> float | None:
    """Spearman's rank correlation (the Pearson correlation of average ranks, ties included);
    None where it is undefined (fewer than two values, or a constant one)."""
    rx, ry = average_ranks(x), average_ranks(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    denominator = float((rx.square().sum() * ry.square().sum()).sqrt())
    return float((rx * ry).sum()) / denominator if denominator > 0 else None
