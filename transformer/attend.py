"""The attention kernels: softmax(QK^T / sqrt(d)) V of projected queries, keys and values
(B, H, T, Dh) under a mask, apart from the module that owns projections, caches and head masks
(:class:`transformer.attention.MultiheadAttention`).

By default PyTorch's ``scaled_dot_product_attention`` (flash, memory-efficient or fused CPU
kernels, chosen by PyTorch). The explicit path (:func:`explicit_attention`) computes the same
numbers and returns the per-head weights; it doubles as the reference in tests.

On CPU, bf16/fp16 attention (autocast or half-precision weights) avoids PyTorch's slow bf16 CPU
kernel (:func:`sdpa`): by hand in bf16 for training, the float32 kernel for inference. On CUDA,
grouped-query attention hands SDPA its grouped key/value heads only where the flash kernel takes
them (:func:`fused_gqa`); elsewhere they are repeated to the query heads first, so that a masked
call runs the memory-efficient kernel rather than the math fallback. A cached decoding step on
CPU runs as two batched matrix products (:func:`step_attention`). :func:`attend` chooses among
them for a call of :class:`~transformer.attention.MultiheadAttention`.
"""

from __future__ import annotations

import math
from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

from transformer import kernels
from transformer.dropout import dropout
from transformer.masks import attention_allowed, causal_allowed


def repeat_heads(x: Tensor, heads: int) -> Tensor:
    """Grouped keys or values (B, Hkv, T, Dh) -> (B, heads, T, Dh): query head h reads key/value
    head h // (heads // Hkv), as ``repeat_interleave`` on dim 1 (one copy, no index kernel)."""
    B, Hkv, T, Dh = x.shape
    if Hkv == heads:
        return x
    return x[:, :, None].expand(B, Hkv, heads // Hkv, T, Dh).reshape(B, heads, T, Dh)


def fused_gqa(device_type: str, dtype: torch.dtype, head_dim: int, masked: bool) -> bool:
    """Whether SDPA with fewer key/value heads than query heads (``enable_gqa=True``) runs a fused
    kernel rather than the math fallback, which materialises (B, H, Tq, Tk) float32 scores.

    CUDA (PyTorch 2.13): the flash kernel takes grouped heads but no mask, fp16/bf16 only and
    head_dim <= 256; the memory-efficient kernel (masks, float32) needs as many key/value heads as
    query heads (cuDNN's, tried first only on some GPUs and cuDNN versions, is not counted on).
    CPU: its fused kernel takes grouped heads, masked or not. Other devices: left to PyTorch.
    """
    if device_type != "cuda":
        return True
    return not masked and dtype in (torch.float16, torch.bfloat16) and head_dim <= 256


def explicit_attention(
    q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None, dropout_p: float = 0.0
) -> tuple[Tensor, Tensor]:
    """q (B, H, Tq, Dh), k and v (B, Hkv, Tk, Dh) -> output (B, H, Tq, Dh), weights (B, H, Tq, Tk).

    ``allowed`` is either of SDPA's masks: bool, True where attention is allowed, or additive
    (:func:`transformer.masks.padding_bias`). Weights are exactly 0 at disallowed keys; with a
    bool mask, a row with no allowed key is all zeros (not NaN).
    """
    k, v = repeat_heads(k, q.size(1)), repeat_heads(v, q.size(1))  # (B, H, Tk, Dh)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))  # (B, H, Tq, Tk)
    boolean = allowed is not None and allowed.dtype == torch.bool
    if boolean:
        scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    elif allowed is not None:
        scores = scores + allowed
    # bf16/fp16 scores: softmax in float32; float32 and float64 keep their own precision
    weights = scores.softmax(-1, dtype=torch.promote_types(scores.dtype, torch.float32))
    weights = weights.to(v.dtype)
    if boolean:
        weights = weights.masked_fill(~allowed, 0.0)
    return dropout(weights, dropout_p) @ v, weights


def sdpa(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    enable_gqa: bool = False,
) -> Tensor:
    """``F.scaled_dot_product_attention``, but for bf16/fp16 inputs on CPU, where PyTorch's
    attention kernel is slower in bf16 than in float32 (docs/benchmarks.md#bf16-attention-on-cpu).
    Training (queries that need gradients) goes through :func:`explicit_attention` (bf16 matrix
    multiplications, float32 softmax), faster still; inference (decoding, cached or not) through the
    float32 kernel, so that cached and uncached decoding agree. The output keeps the queries' type.
    Grouped key/value heads that no fused kernel would take (:func:`fused_gqa`) are repeated to the
    query heads first."""
    if enable_gqa and not fused_gqa(q.device.type, q.dtype, q.size(-1), attn_mask is not None):
        k, v = repeat_heads(k, q.size(1)), repeat_heads(v, q.size(1))  # (B, H, Tk, Dh)
        enable_gqa = False
    if q.device.type != "cpu" or q.dtype not in (torch.bfloat16, torch.float16):
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
            enable_gqa=enable_gqa,
        )  # fmt: skip
    if q.requires_grad:
        if is_causal:
            attn_mask = causal_allowed(q.size(2), k.size(2), device=q.device)
        return explicit_attention(q, k, v, attn_mask, dropout_p)[0]
    if attn_mask is not None and attn_mask.is_floating_point():  # additive: the kernel's dtype
        attn_mask = attn_mask.float()
    with torch.autocast("cpu", enabled=False):  # autocast would cast the inputs back
        out = F.scaled_dot_product_attention(
            q.float(), k.float(), v.float(), attn_mask=attn_mask, dropout_p=dropout_p,
            is_causal=is_causal, enable_gqa=enable_gqa,
        )  # fmt: skip
    return out.to(q.dtype)


def step_attention(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None) -> Tensor:
    """One decoding step on CPU: q (B, H, Tq, Dh) against cached k, v (B, Hkv, Tk, Dh) ->
    (B, H, Tq, Dh), as two batched matrix products that read the cache's strided keys and values
    where they lie; PyTorch's fused CPU kernel is slower on them than on contiguous ones
    (docs/benchmarks.md#ctranslate2-against-our-decoder). bf16/fp16 compute in float32 (as
    :func:`sdpa` decodes), float32 and float64 in their own precision. ``allowed``, broadcastable
    to (B, 1, 1, Tk) (key padding, a length mask; no causal mask) or, per head, (B or 1, H, Tq,
    Tk) (a relative bias): bool, True where allowed, or a float additive mask
    (``transformer.masks``)."""
    B, H, Tq, Dh = q.shape
    Hkv, Tk, dtype = k.size(1), k.size(2), q.dtype
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    q = q.to(compute).reshape(B * Hkv, H // Hkv * Tq, Dh)  # a key/value head's query heads together
    k, v = k.to(compute).reshape(B * Hkv, Tk, Dh), v.to(compute).reshape(B * Hkv, Tk, Dh)
    scores = torch.bmm(q, k.transpose(1, 2)).mul_(1 / math.sqrt(Dh))  # (B * Hkv, H/Hkv * Tq, Tk)
    if allowed is not None and allowed.size(1) == H > 1:  # per head: a relative bias
        allowed = allowed.reshape(allowed.size(0), Hkv, H // Hkv * Tq, Tk)
    if allowed is not None and allowed.dtype == torch.bool:
        scores.view(B, Hkv, -1, Tk).masked_fill_(~allowed, torch.finfo(compute).min)
    elif allowed is not None:
        scores.view(B, Hkv, -1, Tk).add_(allowed)
    out = torch.bmm(scores.softmax(-1), v)  # (B * Hkv, H/Hkv * Tq, Dh)
    return out.view(B, H, Tq, Dh).to(dtype)


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    bias: Tensor | None,
    relative: bool,
    key_padding_mask: Tensor | None,
    causal: bool,
    self_attention: bool,
    offset: int,
    cached: bool,
    grouped: bool,
    dropout_p: float,
    need_weights: bool,
    backends: list[SDPBackend] | None,
) -> tuple[Tensor, Tensor | None]:
    """q (B, H, Tq, Dh), k and v (B, Hkv, Tk, Dh) -> the output (B, H, Tq, Dh) and, if
    ``need_weights``, the weights (B, H, Tq, Tk), through the kernel that fits the call.

    The mask is ``bias`` where the caller built one (additive, (B or 1, 1 or H, Tq or 1, Tk): the
    layer stack's padding, a cache's length mask, or a ``relative`` position bias), else built here
    from ``key_padding_mask`` (B, Tk) and ``causal`` (the queries sit at ``offset`` after the keys'
    start). The weights need :func:`explicit_attention`. Otherwise a causal square block of
    ``self_attention`` with no padding takes the kernels' fast causal path (square: self-attention
    has Tk = offset + Tq, a test on plain ints that torch.compile's symbolic sizes keep a bool), and
    one new query after the cache sees every key, so it needs no mask at all; a ``cached`` step of
    one query on CPU runs :func:`step_attention`; the rest :func:`sdpa`, restricted to ``backends``
    when given, told whether the keys and values are ``grouped`` (fewer heads than the queries: a
    plain bool, where torch.compile would trace a size test). Keys and values of B / beams rows
    (beam search keeps one set of cross-attention keys and values a sentence) serve the queries of
    its ``beams`` rows as one block of beams * Tq positions."""
    beams, Tq, Tk = q.size(0) // k.size(0), q.size(2), k.size(2)
    if beams > 1:
        q = q.unflatten(0, (-1, beams)).transpose(1, 2).flatten(2, 3)  # (B/beams, H, beams*Tq, Dh)
    weights = None
    if need_weights:
        if bias is not None:  # a relative bias stays additive; a padding mask turns bool
            allowed = bias if relative else bias.eq(0)
        else:
            allowed = attention_allowed(key_padding_mask, causal, q.size(2), Tk, offset, q.device)
        out, weights = explicit_attention(q, k, v, allowed, dropout_p)
    else:
        fast_causal = causal and self_attention and key_padding_mask is None and offset == 0
        needs_mask = causal and not fast_causal and not (Tq == 1 and offset == Tk - 1)
        if bias is not None:
            fast_causal, needs_mask, allowed = False, False, bias
        else:
            allowed = attention_allowed(key_padding_mask, needs_mask, Tq, Tk, offset, q.device)
        step = cached and Tq == 1 and not needs_mask and not dropout_p
        if step and kernels.cpu_kernels(q) and q.size(1):  # (pruned to no heads: SDPA)
            out = step_attention(q, k, v, allowed)
        else:
            with sdpa_kernel(backends, set_priority=True) if backends else nullcontext():
                out = sdpa(
                    q, k, v, attn_mask=allowed, dropout_p=dropout_p, is_causal=fast_causal,
                    enable_gqa=grouped,
                )  # fmt: skip
    if beams > 1:  # back to one row per beam: (B, H, Tq, Dh) and (B, H, Tq, Tk)
        out = out.unflatten(2, (beams, Tq)).transpose(1, 2).flatten(0, 1)
        if weights is not None:
            weights = weights.unflatten(2, (beams, Tq)).transpose(1, 2).flatten(0, 1)
    return out, weights
