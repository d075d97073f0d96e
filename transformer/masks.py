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
A query row with no allowed key produces a zero output and zero weights, never NaN (under
:func:`padding_bias` the average of the values: finite too).

A layer stack turns its padding once per batch into the form the kernels take,
:func:`padding_bias`, and hands that to every layer, rather than each layer building ``allowed``
and SDPA turning it into an additive mask again at every call.

Decoding builds its masks once (the source padding once per batch, the self-attention length mask
once per step, for every layer) in the same additive form: its caches carry them.
"""

from __future__ import annotations

import torch
from torch import Tensor


def padding_mask(tokens: Tensor, pad_id: int) -> Tensor:
    """(B, T) token ids -> (B, T) bool, True at padding."""
    return tokens.eq(pad_id)


def padding_bias(key_padding_mask: Tensor, dtype: torch.dtype) -> Tensor:
    """(B, Tk) bool, True at padding -> (B, 1, 1, Tk) additive mask in ``dtype``: 0 where attention
    is allowed, ``dtype``'s lowest number at padding.

    SDPA turns a boolean mask into this at every call (and autocast casts a float mask of another
    dtype), so a layer stack builds it once per batch in the dtype attention computes in. In
    eager mode its rows lie a multiple of 8 elements apart, as CUDA's memory-efficient kernel
    wants them (it copies a mask that is not); not while compiling, where the rounding of a
    symbolic length would become a guard. The lowest number rather than -inf: a query that has
    an allowed key gets the same weights (exp of a masked score underflows to exactly 0), and
    one that has none (a row of padding that shape buckets add, whose outputs nothing reads)
    averages the values instead of giving NaN.
    """
    B, Tk = key_padding_mask.shape
    row = Tk if torch.compiler.is_compiling() else -(-Tk // 8) * 8
    bias = torch.zeros(B, 1, 1, row, dtype=dtype, device=key_padding_mask.device)[..., :Tk]
    return bias.masked_fill_(key_padding_mask[:, None, None, :], torch.finfo(dtype).min)


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


def positions_bias(steps: int, dtype: torch.dtype, device: torch.device | None = None) -> Tensor:
    """(T, T) additive mask of ``dtype`` whose row t lets a query at position t see keys 0..t:
    a decoding step's length mask, where the cache holds T positions."""
    bias = torch.zeros(steps, steps, dtype=dtype, device=device)
    return bias.masked_fill_(~causal_allowed(steps, steps, device=device), torch.finfo(dtype).min)
