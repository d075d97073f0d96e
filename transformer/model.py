"""The encoder-decoder Transformer: embeddings, layer stacks, output projection.

Initialisation (stated, as in fairseq's transformer): token embeddings ~ N(0, d_model^-1/2) with a
zero padding row, so that embedding * sqrt(d_model) has unit scale; every projection matrix
Xavier-uniform (Q, K and V each as its own matrix); biases zero; LayerNorm weight 1 and bias 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from transformer.attention import MultiheadAttention
from transformer.config import ATTENTION_TYPES, TransformerConfig
from transformer.embedding import TransformerEmbedding
from transformer.kv_cache import DecoderCache
from transformer.layers import Decoder, Encoder
from transformer.linear import Linear
from transformer.masks import padding_mask


@dataclass
class AttentionMaps:
    """Per-layer attention weights, each (B, H, Tq, Tk); filled when passed to a forward call."""

    encoder_self: list[Tensor] = field(default_factory=list)
    decoder_self: list[Tensor] = field(default_factory=list)
    cross: list[Tensor] = field(default_factory=list)


class Transformer(nn.Module):
    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.cfg = cfg
        src_tokens = self._embedding(cfg.src_vocab_size)
        tgt_tokens = src_tokens if cfg.share_all_embeddings else self._embedding(cfg.tgt_vocab_size)
        self.src_embed = TransformerEmbedding(
            src_tokens, cfg.max_positions, cfg.dropout, cfg.positions
        )
        self.tgt_embed = TransformerEmbedding(
            tgt_tokens, cfg.max_positions, cfg.dropout, cfg.positions
        )
        self.encoder = Encoder(cfg)
        self.decoder = Decoder(cfg)
        self.output = Linear(cfg.d_model, cfg.tgt_vocab_size, bias=cfg.output_bias)
        if cfg.output_bias:
            nn.init.zeros_(self.output.bias)
        if cfg.tie_output_embeddings or cfg.share_all_embeddings:
            self.output.weight = tgt_tokens.weight
        else:
            nn.init.normal_(self.output.weight, std=cfg.d_model**-0.5)

    def _embedding(self, vocab_size: int) -> nn.Embedding:
        emb = nn.Embedding(vocab_size, self.cfg.d_model, padding_idx=self.cfg.pad_id)
        nn.init.normal_(emb.weight, std=self.cfg.d_model**-0.5)
        nn.init.zeros_(emb.weight[self.cfg.pad_id])
        return emb

    def encode(
        self,
        src: Tensor,
        src_pad_mask: Tensor | None = None,
        attention: AttentionMaps | None = None,
    ) -> Tensor:
        """src (B, S) token ids -> memory (B, S, D). The mask defaults to ``src == pad_id``."""
        if src_pad_mask is None:
            src_pad_mask = padding_mask(src, self.cfg.pad_id)
        weights = attention.encoder_self if attention is not None else None
        return self.encoder(self.src_embed(src), src_pad_mask, weights)

    def init_cache(
        self,
        memory: Tensor,
        memory_pad_mask: Tensor | None,
        capacity: int | None = None,
        static: bool = False,
    ) -> DecoderCache:
        """A cache for incremental decoding with every layer's cross-attention K/V computed now,
        and the source padding's mask. ``capacity``: the most target positions the decoding
        will feed (its self-attention buffers are then allocated once); ``static``: every step
        the same shapes (see :class:`DecoderCache`)."""
        layers = self.decoder.layers
        cross_kv = [layer.cross_attn.project_kv(memory) for layer in layers]
        shapes = [(layer.self_attn.num_kv_heads, layer.self_attn.head_dim) for layer in layers]
        if capacity is not None and capacity > self.cfg.max_positions:
            raise ValueError(
                f"a cache of {capacity} positions, beyond max_positions={self.cfg.max_positions}"
            )
        return DecoderCache.empty(cross_kv, memory_pad_mask, shapes, capacity, static)

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor | None = None,
        memory_pad_mask: Tensor | None = None,
        cache: DecoderCache | None = None,
        attention: AttentionMaps | None = None,
        return_hidden: bool = False,
    ) -> Tensor:
        """Decoder input ids (B, T) -> logits (B, T, V), or with ``return_hidden`` the final
        decoder states (B, T, D) that :attr:`output` projects to logits (training projects only
        the non-pad positions).

        Without a cache: ``tgt`` is the whole (right-padded) decoder input and ``memory`` the
        encoder output. With a cache from :meth:`init_cache`: ``tgt`` holds only the new steps,
        positions continue from ``cache.offset``, and memory and its mask come from the cache.
        A static cache takes one step a call, at its device position (no host value is read).
        """
        if cache is None and memory is None:
            raise ValueError("decode needs the encoder output `memory`, or a cache from init_cache")
        offset = cache.step_positions(tgt.size(1)) if cache is not None else 0
        self_w, cross_w = (attention.decoder_self, attention.cross) if attention else (None, None)
        x = self.decoder(
            self.tgt_embed(tgt, offset), memory, memory_pad_mask, cache, self_w, cross_w, offset
        )  # (B, T, D)
        return x if return_hidden else self.output(x)  # (B, T, V)

    def forward(
        self,
        src: Tensor,
        tgt: Tensor,
        src_pad_mask: Tensor | None = None,
        attention: AttentionMaps | None = None,
        return_hidden: bool = False,
    ) -> Tensor:
        """Teacher-forced logits (B, T, V) for source ids (B, S) and decoder input ids (B, T);
        with ``return_hidden`` the decoder states (B, T, D) before the output projection."""
        if src_pad_mask is None:
            src_pad_mask = padding_mask(src, self.cfg.pad_id)
        memory = self.encode(src, src_pad_mask, attention)
        return self.decode(
            tgt, memory, src_pad_mask, attention=attention, return_hidden=return_hidden
        )

    def attention_modules(self, kind: str) -> list[MultiheadAttention]:
        """The attention modules of one type (see ``ATTENTION_TYPES``), one per layer."""
        if kind == "encoder_self":
            return [layer.self_attn for layer in self.encoder.layers]
        if kind == "decoder_self":
            return [layer.self_attn for layer in self.decoder.layers]
        if kind == "cross":
            return [layer.cross_attn for layer in self.decoder.layers]
        raise ValueError(f"unknown attention type {kind!r}; one of {ATTENTION_TYPES}")

    def set_head_mask(self, kind: str, layer: int, mask: Tensor | None) -> None:
        """Scale the heads of one attention module: ``mask`` (H,), 0 = head off; None clears."""
        module = self.attention_modules(kind)[layer]
        if mask is not None:
            if mask.shape != (module.num_heads,):
                shape = tuple(mask.shape)
                raise ValueError(f"head mask of shape {shape}, need ({module.num_heads},)")
            mask = mask.to(device=module.out_proj.weight.device, dtype=torch.float32)
        module.head_mask = mask

    def clear_head_masks(self) -> None:
        for kind in ATTENTION_TYPES:
            for module in self.attention_modules(kind):
                module.head_mask = None

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
