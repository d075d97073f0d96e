"""Multi-head attention: one module for encoder self-, causal decoder self- and cross-attention.

The module owns the projections, the KV cache and the head mask; the kernels that attend
(:mod:`transformer.attend`) take its projected queries, keys and values. By default PyTorch's
``scaled_dot_product_attention``; when per-head weights are asked for (``need_weights=True``),
the explicit softmax(QK^T / sqrt(d)) V path runs instead and returns them.

A head mask (``head_mask``, (H,) floats, None by default) scales each head's output before the
output projection, in both kernels: 0 silences a head (Michel et al. 2019). None costs nothing.
A (B, H) mask gates each sentence's heads apart: a gradient with respect to it is per sentence.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor, nn
from torch.nn.attention import SDPBackend

from transformer import attend
from transformer.config import check_heads
from transformer.kv_cache import KVCache
from transformer.linear import Linear
from transformer.positions import rotate


class MultiheadAttention(nn.Module):
    """Multi-head (optionally grouped-query) attention.

    Self-attention (``cross=False``) projects its one input with a single fused QKV matrix;
    cross-attention (``cross=True``) projects queries from the decoder stream and keys/values with
    one fused KV matrix from the encoder output. ``q_dim`` and ``kv_dim`` let inputs be wider or
    narrower than ``d_model``; the output is always ``d_model`` wide. ``head_dim`` (default
    ``d_model / num_heads``) set apart from the head count gives a pruned module: ``num_heads``
    heads of ``head_dim`` each, ``num_heads * head_dim`` wide inside (0 heads: the output bias).
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        num_kv_heads: int | None = None,
        *,
        cross: bool = False,
        q_dim: int | None = None,
        kv_dim: int | None = None,
        dropout: float = 0.0,
        bias: bool = True,
        head_dim: int | None = None,
        relative_bias: bool = False,
    ) -> None:
        super().__init__()
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if head_dim is None:
            check_heads(d_model, num_heads, num_kv_heads)
            head_dim = d_model // num_heads
        elif (num_heads == 0) != (num_kv_heads == 0) or (num_kv_heads and num_heads % num_kv_heads):
            raise ValueError(f"num_kv_heads={num_kv_heads} does not divide num_heads={num_heads}")
        if kv_dim is not None and not cross:
            raise ValueError("kv_dim is for cross-attention; self-attention has one input, q_dim")
        q_dim = q_dim or d_model
        kv_dim = kv_dim or d_model
        self.d_model, self.num_heads, self.num_kv_heads = d_model, num_heads, num_kv_heads
        self.head_dim = head_dim
        self.q_width = num_heads * head_dim  # = d_model unless pruned
        self.kv_width = num_kv_heads * head_dim
        self.cross = cross
        self.dropout = dropout
        with warnings.catch_warnings():  # a module pruned to no heads has empty matrices
            warnings.filterwarnings("ignore", "Initializing zero-element tensors")
            if cross:
                self.q_proj = Linear(q_dim, self.q_width, bias=bias)
                self.kv_proj = Linear(kv_dim, 2 * self.kv_width, bias=bias)
            else:
                self.qkv_proj = Linear(q_dim, self.q_width + 2 * self.kv_width, bias=bias)
            self.out_proj = Linear(self.q_width, d_model, bias=bias)
        # (H,) per-head output scale; not saved in checkpoints, follows the module's device.
        self.register_buffer("head_mask", None, persistent=False)
        # SDPA's backends this module's calls may use, first preferred; None: as set around it
        # (transformer.sdpa_backends.selected sets this where attention types differ).
        self.sdpa_backends: list[SDPBackend] | None = None
        # relative_bias: the heads of its layer stack's relative bias (transformer.positions) that
        # this module's heads read, (H,), saved: pruning keeps the removed heads' out of it.
        self.register_buffer("bias_heads", torch.arange(num_heads) if relative_bias else None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-uniform on each Q, K, V and output matrix (as if unfused); zero biases."""
        q, kv = self.q_width, self.kv_width
        if self.cross:
            blocks = [(self.q_proj, [q]), (self.kv_proj, [kv, kv])]
        else:
            blocks = [(self.qkv_proj, [q, kv, kv])]
        for linear, rows in (*blocks, (self.out_proj, [self.d_model])):
            for block in linear.weight.data.split(rows, dim=0):
                if block.numel():  # a pruned module may have no heads
                    nn.init.xavier_uniform_(block)
            if linear.bias is not None:
                nn.init.zeros_(linear.bias)

    def _heads(self, x: Tensor, n: int) -> Tensor:
        B, T, _ = x.shape
        return x.view(B, T, n, self.head_dim).transpose(1, 2)  # (B, n, T, Dh)

    def project_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values of the encoder output: (B, S, kv_dim) -> 2 x (B, Hkv, S, Dh)."""
        return self.split_kv(self.kv_proj(memory))

    def split_kv(self, kv: Tensor) -> tuple[Tensor, Tensor]:
        """``kv_proj``'s output (B, S, 2 * kv_width) -> keys and values, 2 x (B, Hkv, S, Dh)."""
        k, v = kv.split([self.kv_width, self.kv_width], dim=-1)
        return self._heads(k, self.num_kv_heads), self._heads(v, self.num_kv_heads)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        key_padding_mask: Tensor | None = None,
        causal: bool = False,
        cache: KVCache | None = None,
        need_weights: bool = False,
        attn_mask: Tensor | None = None,
        memory_kv: tuple[Tensor, Tensor] | None = None,
        rotary: tuple[Tensor, Tensor] | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from ``x`` (B, Tq, q_dim) to itself, or to ``memory`` (B, S, kv_dim) if cross.

        key_padding_mask: (B, Tk) bool, True at padding (see ``transformer.masks``); for a cached
            self-attention step it covers all keys, cached and new.
        causal: forbid attending to later positions; with a cache, new queries follow the cached.
        cache: self-attention appends this call's keys/values; cross-attention fills it from
            ``memory`` on first use and afterwards reads it (``memory`` may then be None).
        attn_mask: the keys' padding as the kernels take it, (B, 1, 1, Tk) from
            :func:`transformer.masks.padding_bias`, built once per batch by the layer stack; it
            replaces ``key_padding_mask`` (for attention without ``causal`` and ``cache``).
            With a relative bias (``bias_heads``) it is the whole additive mask, (B or 1, H, Tq,
            Tk): bias, padding and causality (and a cache's length mask) together.
        memory_kv: cross-attention's keys and values of ``memory``, 2 x (B, Hkv, S, Dh), projected
            beforehand (the decoder projects all its layers' at once); they replace ``memory``.
        rotary: self-attention's rotary cos and sin at this call's positions, (Tq, Dh/2) each:
            queries and keys are turned before the kernel, and keys before they are cached.
        Returns the output (B, Tq, d_model) and, if ``need_weights``, weights (B, H, Tq, Tk).
        """
        B, Tq, _ = x.shape
        offset = 0
        if self.cross:
            q = self._heads(self.q_proj(x), self.num_heads)  # (B, H, Tq, Dh)
            if memory_kv is not None:
                k, v = memory_kv  # (B, Hkv, S, Dh)
            elif cache is not None and cache.k is not None:
                k, v = cache.k, cache.v
            else:
                if memory is None:
                    raise ValueError("cross-attention needs `memory` or a filled cache")
                k, v = self.project_kv(memory)  # (B, Hkv, S, Dh)
                if cache is not None:
                    cache.append(k, v)
        else:
            qkv = self.qkv_proj(x)  # (B, Tq, H * Dh + 2 * Hkv * Dh)
            if rotary is not None:  # queries and keys turned together: (B, Tq, H + Hkv, Dh)
                qk, v = qkv.split([self.q_width + self.kv_width, self.kv_width], dim=-1)
                qk = qk.unflatten(-1, (self.num_heads + self.num_kv_heads, self.head_dim))
                qkv = torch.cat([rotate(qk, *rotary).flatten(-2), v], dim=-1)
            q, k, v = qkv.split([self.q_width, self.kv_width, self.kv_width], dim=-1)
            q = self._heads(q, self.num_heads)  # (B, H, Tq, Dh)
            if cache is not None:  # keys and values side by side: into the cache in one copy
                offset = cache.length
                kv = qkv[..., self.q_width :].view(B, Tq, 2, self.num_kv_heads, self.head_dim)
                k, v = cache.write(kv)  # (B, Hkv, offset + Tq, Dh); static: all its capacity
            else:
                k, v = self._heads(k, self.num_kv_heads), self._heads(v, self.num_kv_heads)
        dropout_p = self.dropout if self.training else 0.0
        # Masks built once, additive (B or 1, 1, 1, Tk): the layer stack's padding (attn_mask), or
        # the one decoding's cache carries (the source's padding, or the static length mask).
        bias = attn_mask if attn_mask is not None else cache.bias if cache is not None else None
        out, weights = attend.attend(
            q, k, v, bias=bias, relative=self.bias_heads is not None,
            key_padding_mask=key_padding_mask, causal=causal, self_attention=not self.cross,
            offset=offset, cached=cache is not None,
            grouped=self.num_kv_heads != self.num_heads, dropout_p=dropout_p,
            need_weights=need_weights, backends=self.sdpa_backends,
        )  # fmt: skip
        if self.head_mask is not None:  # (H,), or (B, H): one gate per sentence and head
            gates = self.head_mask.to(out.dtype)
            out = out * gates.reshape(*gates.shape, 1, 1)  # (B, H, Tq, Dh)
        out = out.transpose(1, 2).reshape(B, Tq, self.q_width)  # merge heads: (B, Tq, H * Dh)
        return self.out_proj(out), weights
