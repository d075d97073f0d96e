"""The one mask convention of this package.

Callers describe masking in two ways, and only in these two ways:

* ``key_padding_mask``: a bool tensor ``(B, Tk)`` that is **True at padding**, at keys that must
  not be attended to. It is what ``tokens.eq(pad_id)`` gives (see :func:`padding_mask`), and it has
  the same polarity as ``torch.nn.MultiheadAttention``'s ``key_padding_mask``.
* ``causal``: a flag. Query ``i`` may attend to key ``j`` only when ``j <= i + offset``, where
  ``offset`` is the number of keys that precede the first query (the cached steps of incremental
  decoding).

Inside the attention module both are turned, here and nowhere else, into one boolean
``allowed`` tensor broadcastable to ``(B, H, Tq, Tk)`` that is **True where attention is allowed**:
the polarity of ``torch.nn.functional.scaled_dot_product_attention``'s boolean ``attn_mask``.
A query row with no allowed key produces a zero output and zero weights, never NaN.

Decoding builds its masks once (the source padding once per batch, the self-attention length mask
once per step, for every layer) in the additive form SDPA adds to the scores: a float ``bias``
that is 0 where attention is allowed and the dtype's lowest value where not.
"""

from __future__ import annotations

import torch
from torch import Tensor


def padding_mask(tokens: Tensor, pad_id: int) -> Tensor:
    """(B, T) token ids -> (B, T) bool, True at padding."""
    return tokens.eq(pad_id)


def causal_allowed(tq: int, tk: int, offset: int = 0, device: torch.device | None = None) -> Tensor:
    """(Tq, Tk) bool, True where query ``i`` may see key ``j``: ``j <= i + offset``."""
    q = torch.arange(tq, device=device).unsqueeze(1) + offset
    k = torch.arange(tk, device=device).unsqueeze(0)
    return k <= q


def attention_allowed(
    key_padding_mask: Tensor | None,
    causal: bool,
    tq: int,
    tk: int,
    offset: int = 0,
    device: torch.device | None = None,
) -> Tensor | None:
    """Combine padding and causality into one bool mask, True = may attend.

    Returns ``None`` when nothing is masked, else a tensor broadcastable to (B, H, Tq, Tk):
    (B, 1, 1, Tk) for padding alone, (Tq, Tk) for causality alone, (B, 1, Tq, Tk) for both.
    """
    allowed = None
    if key_padding_mask is not None:
        allowed = ~key_padding_mask[:, None, None, :]  # (B, 1, 1, Tk)
    if causal:
        c = causal_allowed(tq, tk, offset, device)  # (Tq, Tk)
        allowed = c if allowed is None else allowed & c
    return allowed


def padding_bias(key_padding_mask: Tensor, dtype: torch.dtype) -> Tensor:
    """(B, Tk) bool, True at padding -> (B, 1, 1, Tk) additive mask of ``dtype``."""
    bias = torch.zeros(key_padding_mask.shape, dtype=dtype, device=key_padding_mask.device)
    return bias.masked_fill_(key_padding_mask, torch.finfo(dtype).min)[:, None, None, :]


def positions_bias(steps: int, dtype: torch.dtype, device: torch.device | None = None) -> Tensor:
    """(T, T) additive mask of ``dtype`` whose row t lets a query at position t see keys 0..t:
    a decoding step's length mask, where the cache holds T positions."""
    bias = torch.zeros(steps, steps, dtype=dtype, device=device)
    return bias.masked_fill_(~causal_allowed(steps, steps, device=device), torch.finfo(dtype).min)
