"""Per-head statistics of attention weights (Voita et al. 2019; Clark et al. 2019).

For each head, averaged over every query position of the sentences seen:

* ``entropy``: of the query's weight distribution (nats);
* ``confidence``: its largest weight;
* ``same`` / ``previous`` / ``next``: weight on the key at the query's position, one before, one
  after (for cross-attention: the source position of the same index, a monotone-alignment cue);
* ``eos``: weight on the sentence-boundary token, the source's eos for encoder self- and
  cross-attention and the decoder input's bos for decoder self-attention (a "no-op" slot);
* ``agreement``: the share of queries whose most-attended key is that of the mean of all heads of
  all layers of the type (the model's consensus; for cross-attention the proxy of a word
  alignment that :mod:`transformer.analysis.roles` uses, no external aligner being at hand).
"""

from __future__ import annotations

import torch
from torch import Tensor

from transformer.analysis.maps import SentenceMaps
from transformer.data.tokenizer import BOS_ID, EOS_ID

STATS = ("entropy", "confidence", "same", "previous", "next", "eos", "agreement")


def row_stats(weights: Tensor, key_ids: list[int]) -> dict[str, Tensor]:
    """weights (L, H, Tq, Tk) -> each statistic summed over the Tq query rows: (L, H)."""
    boundary = torch.tensor([i in (EOS_ID, BOS_ID) for i in key_ids])  # (Tk,)
    consensus = weights.mean((0, 1)).argmax(-1)  # (Tq,)
    diagonal = {
        name: torch.diagonal(weights, offset=offset, dim1=-2, dim2=-1).sum(-1)
        for name, offset in (("same", 0), ("previous", -1), ("next", 1))
    }
    return {
        "entropy": -torch.xlogy(weights, weights).sum(-1).sum(-1),
        "confidence": weights.amax(-1).sum(-1),
        **diagonal,
        "eos": weights[..., boundary].sum(-1).sum(-1),
        "agreement": weights.argmax(-1).eq(consensus).sum(-1).to(weights.dtype),
    }


def head_stats(sentences: list[SentenceMaps], kind: str) -> dict[str, Tensor]:
    """Each statistic of ``STATS`` per head of one attention type, (L, H), averaged over all
    query rows of ``sentences``."""
    sums: dict[str, Tensor] = {}
    rows = 0
    for sentence in sentences:
        weights = sentence.weights[kind]  # (L, H, Tq, Tk)
        for name, value in row_stats(weights, sentence.axes(kind)[1]).items():
            sums[name] = sums.get(name, 0) + value
        rows += weights.size(-2)
    return {name: sums[name] / max(rows, 1) for name in STATS}
