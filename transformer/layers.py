"""Encoder and decoder layer stacks, pre-norm by default, post-norm as an option."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer.attention import MultiheadAttention
from transformer.config import TransformerConfig
from transformer.dropout import Dropout
from transformer.kv_cache import DecoderCache, KVCache
from transformer.linear import Linear, linear_layer
from transformer.masks import padding_bias
from transformer.positions import LinearBias, RelativeBias, Rotary
from transformer.precision import compute_dtype

SublayerOut = tuple[Tensor, Tensor | None]  # output and attention weights, if any
ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu, "silu": F.silu}  # gelu: the exact (erf) one


class FeedForward(nn.Module):
    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.fc1 = Linear(cfg.d_model, cfg.d_ff, bias=cfg.bias)
        self.fc2 = Linear(cfg.d_ff, cfg.d_model, bias=cfg.bias)
        self.activation = ACTIVATIONS[cfg.activation]
        self.dropout = Dropout(cfg.activation_dropout)
        for fc in (self.fc1, self.fc2):
            nn.init.xavier_uniform_(fc.weight)
            if fc.bias is not None:
                nn.init.zeros_(fc.bias)

    def forward(self, x: Tensor) -> SublayerOut:
        return self.fc2(self.dropout(self.activation(self.fc1(x)))), None


class Residual(nn.Module):
    """Pre-norm ``x + drop(f(norm(x)))`` or post-norm ``norm(x + drop(f(x)))`` around a sublayer."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.dropout = Dropout(cfg.dropout)
        self.norm_first = cfg.norm_first

    def forward(self, x: Tensor, sublayer: Callable[[Tensor], SublayerOut]) -> SublayerOut:
        if self.norm_first:
            y, weights = sublayer(self.norm(x))
            return x + self.dropout(y), weights
        y, weights = sublayer(x)
        return self.norm(x + self.dropout(y)), weights


def _attention(cfg: TransformerConfig, kind: str, layer: int) -> MultiheadAttention:
    """Layer ``layer``'s attention of type ``kind``, with its heads (fewer where pruned)."""
    heads = cfg.layer_heads(kind)[layer]
    kv_heads = heads // (cfg.num_heads // cfg.num_kv_heads)
    return MultiheadAttention(
        cfg.d_model, heads, kv_heads, cross=kind == "cross", dropout=cfg.attention_dropout,
        bias=cfg.bias, head_dim=cfg.head_dim,
        relative_bias=cfg.positions in ("relative", "alibi") and kind != "cross",
    )  # fmt: skip


class StackPositions(nn.Module):
    """What a layer stack's self-attention knows of positions (``model.positions``): rotary
    tables, or a relative bias (one table for all its layers, as T5's; or ALiBi's fixed linear
    one), or nothing."""

    def __init__(self, cfg: TransformerConfig, bidirectional: bool) -> None:
        super().__init__()
        rope, relative = cfg.positions == "rope", cfg.positions == "relative"
        self.rotary = Rotary(cfg.head_dim, cfg.max_positions) if rope else None
        self.relative_bias = RelativeBias(cfg.num_heads, bidirectional) if relative else None
        self.linear_bias = LinearBias(cfg.num_heads) if cfg.positions == "alibi" else None

    @property
    def bias(self) -> RelativeBias | LinearBias | None:
        """The stack's attention bias module (T5's or ALiBi's), or None."""
        return self.linear_bias if self.relative_bias is None else self.relative_bias

    def rotations(self, offset: int | Tensor, steps: int) -> tuple[Tensor, Tensor] | None:
        """Rotary cos and sin of positions offset.. (Tq, Dh/2) each, or None."""
        return None if self.rotary is None else self.rotary(offset, steps)

    def mask(
        self, offset: int | Tensor, queries: int, keys: int, mask: Tensor | None, causal: bool,
        dtype: torch.dtype,
    ) -> Tensor | None:  # fmt: skip
        """With a relative bias: (B or 1, H, Tq, Tk) the bias of queries at offset.. over keys
        0..Tk-1 plus ``mask`` (additive, broadcastable) and, if ``causal``, the causal mask:
        the one mask of every layer. Without one: ``mask`` as it is."""
        if self.bias is None:
            return mask
        bias = self.bias(offset, queries, keys).to(dtype)  # (1, H, Tq, Tk)
        if causal:  # (an int offset: a static step has one query and a length mask)
            later = torch.ones(queries, keys, dtype=torch.bool, device=bias.device)
            later = later.triu(1 + offset)
            bias = bias.masked_fill(later, torch.finfo(dtype).min)
        return bias if mask is None else bias + mask


def layer_mask(mask: Tensor | None, attn: MultiheadAttention) -> Tensor | None:
    """A stack's mask for one layer: with a relative bias, that of its (unpruned) heads."""
    if mask is None or attn.bias_heads is None or mask.size(1) == attn.num_heads:
        return mask  # (a layer with all its heads has them in order)
    return mask.index_select(1, attn.bias_heads)  # (B or 1, H_layer, Tq, Tk)


def _final_norm(cfg: TransformerConfig) -> nn.Module:
    # Pre-norm leaves the residual stream unnormalised; post-norm layers already end in a norm.
    return nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps) if cfg.norm_first else nn.Identity()


class EncoderLayer(nn.Module):
    def __init__(self, cfg: TransformerConfig, layer: int = 0) -> None:
        super().__init__()
        self.self_attn = _attention(cfg, "encoder_self", layer)
        self.ffn = FeedForward(cfg)
        self.attn_block, self.ffn_block = Residual(cfg), Residual(cfg)

    def forward(
        self, x: Tensor, attn_mask: Tensor | None, need_weights: bool,
        rotary: tuple[Tensor, Tensor] | None = None,
    ) -> SublayerOut:  # fmt: skip
        """attn_mask: the padding as :func:`transformer.masks.padding_bias` gives it (with a
        relative bias: :meth:`StackPositions.mask`); rotary: the stack's cos and sin."""
        x, weights = self.attn_block(
            x,
            lambda h: self.self_attn(
                h, attn_mask=attn_mask, need_weights=need_weights, rotary=rotary
            ),
        )
        x, _ = self.ffn_block(x, self.ffn)
        return x, weights


class DecoderLayer(nn.Module):
    def __init__(self, cfg: TransformerConfig, layer: int = 0) -> None:
        super().__init__()
        self.self_attn = _attention(cfg, "decoder_self", layer)
        self.cross_attn = _attention(cfg, "cross", layer)
        self.ffn = FeedForward(cfg)
        self.self_block, self.cross_block = Residual(cfg), Residual(cfg)
        self.ffn_block = Residual(cfg)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None,
        memory_pad_mask: Tensor | None,
        self_cache: KVCache | None,
        cross_cache: KVCache | None,
        need_weights: bool,
        memory_mask: Tensor | None = None,
        memory_kv: tuple[Tensor, Tensor] | None = None,
        self_mask: Tensor | None = None,
        rotary: tuple[Tensor, Tensor] | None = None,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """memory_mask: the memory's padding as :func:`transformer.masks.padding_bias` gives it,
        in place of ``memory_pad_mask`` (True at padding), which cached decoding passes.
        memory_kv: this layer's cross-attention keys and values, from :meth:`Decoder.memory_kv`.
        self_mask, rotary: self-attention's positions (:class:`StackPositions`), if any."""
        # Targets are right-padded, so causality alone keeps every real query off padded keys;
        # padded queries attend to something harmless and their outputs are ignored by the loss.
        x, self_w = self.self_block(
            x,
            lambda h: self.self_attn(
                h,
                causal=True,
                cache=self_cache,
                need_weights=need_weights,
                attn_mask=self_mask,
                rotary=rotary,
            ),  # fmt: skip
        )
        x, cross_w = self.cross_block(
            x,
            lambda h: self.cross_attn(
                h,
                memory,
                key_padding_mask=memory_pad_mask,
                cache=cross_cache,
                need_weights=need_weights,
                attn_mask=memory_mask,
                memory_kv=memory_kv,
            ),  # fmt: skip
        )
        x, _ = self.ffn_block(x, self.ffn)
        return x, self_w, cross_w


class Encoder(nn.Module):
    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(cfg, i) for i in range(cfg.num_encoder_layers))
        self.norm = _final_norm(cfg)
        self.positions = StackPositions(cfg, bidirectional=True)

    def forward(
        self, x: Tensor, pad_mask: Tensor | None, weights: list[Tensor] | None = None
    ) -> Tensor:
        """x (B, S, D) -> (B, S, D); appends each layer's (B, H, S, S) weights to ``weights``."""
        S, dtype = x.size(1), compute_dtype(x)
        mask = None if pad_mask is None else padding_bias(pad_mask, dtype)  # one a batch
        mask = self.positions.mask(0, S, S, mask, causal=False, dtype=dtype)
        rotary = self.positions.rotations(0, S)
        for layer in self.layers:
            attn_mask = layer_mask(mask, layer.self_attn)
            x, w = layer(x, attn_mask, need_weights=weights is not None, rotary=rotary)
            if weights is not None:
                weights.append(w)
        return self.norm(x)


class Decoder(nn.Module):
    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_decoder_layers))
        self.norm = _final_norm(cfg)
        self.positions = StackPositions(cfg, bidirectional=False)

    def memory_kv(self, memory: Tensor) -> list[tuple[Tensor, Tensor]]:
        """Every layer's cross-attention keys and values of ``memory`` (B, S, D), 2 x (B, Hkv, S,
        Dh) each, from one matrix product with the layers' projections side by side: one large
        product and its backward rather than one of each a layer."""
        attns = [layer.cross_attn for layer in self.layers]
        projections = [a.kv_proj for a in attns]
        weight = torch.cat([p.weight for p in projections])  # (sum of 2 * kv_width, D)
        bias = None if projections[0].bias is None else torch.cat([p.bias for p in projections])
        kv = linear_layer(memory, weight, bias)  # (B, S, sum of 2 * kv_width)
        parts = kv.split([2 * a.kv_width for a in attns], dim=-1)
        return [a.split_kv(part) for a, part in zip(attns, parts, strict=True)]

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None,
        memory_pad_mask: Tensor | None,
        cache: DecoderCache | None = None,
        self_weights: list[Tensor] | None = None,
        cross_weights: list[Tensor] | None = None,
        offset: int | Tensor = 0,
    ) -> Tensor:
        """x (B, T, D) -> (B, T, D); appends (B, H, T, T') and (B, H, T, S) weights to the lists.

        With a cache, ``memory`` and its mask come from the cache and T' counts cached steps too;
        ``offset`` is then the position of the first new step (a static step's: a (1,) tensor).
        """
        need_weights = self_weights is not None
        # Built once for all layers; cached steps take the cache's pad mask, keys and values.
        memory_mask, kvs = None, [None] * len(self.layers)
        if cache is not None:
            memory_pad_mask = None  # the cross-attention caches carry the source padding's mask
        else:
            kvs = self.memory_kv(memory)
            if memory_pad_mask is not None:
                memory_mask = padding_bias(memory_pad_mask, compute_dtype(x))
                memory_pad_mask = None
        self_mask, rotary = self._self_positions(x, cache, offset)
        for i, layer in enumerate(self.layers):
            self_cache = cache.self_attn[i] if cache is not None else None
            cross_cache = cache.cross_attn[i] if cache is not None else None
            x, self_w, cross_w = layer(
                x, memory, memory_pad_mask, self_cache, cross_cache, need_weights, memory_mask,
                kvs[i], layer_mask(self_mask, layer.self_attn), rotary,
            )  # fmt: skip
            if need_weights:
                self_weights.append(self_w)
                cross_weights.append(cross_w)
        return self.norm(x)

    def _self_positions(
        self, x: Tensor, cache: DecoderCache | None, offset: int | Tensor
    ) -> tuple[Tensor | None, tuple[Tensor, Tensor] | None]:
        """Self-attention's mask with the relative bias (None without one) and rotary tables
        (None without them) for the T new steps at ``offset``: causal over T steps uncached, over
        the cached and new steps with a cache, behind its length mask when static."""
        T, dtype = x.size(1), compute_dtype(x)
        rotary = self.positions.rotations(offset, T)
        if self.positions.bias is None:
            return None, rotary
        if cache is not None and cache.static:  # one step, keys: the whole capacity
            length = cache.self_attn[0].bias  # (1, 1, 1, capacity)
            return self.positions.mask(offset, T, length.size(-1), length, False, dtype), rotary
        return self.positions.mask(offset, T, offset + T, None, T > 1, dtype), rotary
