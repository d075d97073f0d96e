"""Key/value caches for incremental decoding.

A :class:`KVCache` belongs to one attention module. Self-attention appends the new step's keys and
values; cross-attention fills it once from the encoder output and then only reads it. Every tensor
in a cache has the batch (times beam) axis first, so one ``reorder(index)`` contract serves beam
search: ``index_select`` along axis 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class KVCache:
    """Keys and values of one attention module, each (B, Hkv, T, Dh); empty until first use."""

    k: Tensor | None = None
    v: Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.size(2)

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add the new steps' (B, Hkv, t, Dh) keys and values; return all cached so far."""
        self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        return self.k, self.v

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` (B',), in that order: beam search's survivors."""
        if self.k is not None:
            self.k = self.k.index_select(0, index)
            self.v = self.v.index_select(0, index)


@dataclass
class DecoderCache:
    """Everything the decoder needs between steps, made by ``Transformer.init_cache``.

    Per decoder layer: the self-attention cache (grows one step per call) and the cross-attention
    cache (the encoder output's keys and values, computed once). With a cache the decoder needs no
    encoder output: the source padding mask lives here too, so ``reorder`` keeps them in step.

    Beam search calls ``expand_beams(k)``: each source row then serves ``k`` consecutive decoder
    rows, and the cross-attention keys/values stay at one copy per sentence (queries of a
    sentence's beams attend to it together). From then on ``reorder`` moves decoder rows only, and
    its index must keep every row within its sentence's block of ``k`` rows, as beam search does.
    """

    self_attn: list[KVCache]
    cross_attn: list[KVCache]
    memory_pad_mask: Tensor | None  # (B, S), True at source padding
    beams: int = 1  # decoder rows per source row

    @classmethod
    def empty(cls, num_layers: int, memory_pad_mask: Tensor | None) -> DecoderCache:
        return cls(
            [KVCache() for _ in range(num_layers)],
            [KVCache() for _ in range(num_layers)],
            memory_pad_mask,
        )

    @property
    def offset(self) -> int:
        """Target positions decoded so far: the position of the next token."""
        return self.self_attn[0].length

    def expand_beams(self, k: int) -> None:
        """Let each source row serve ``k`` decoder rows (before the first decoding step)."""
        if self.offset or self.beams != 1:
            raise ValueError("expand_beams comes once, before the first decoding step")
        self.beams = k

    def reorder(self, index: Tensor) -> None:
        for cache in self.self_attn:
            cache.reorder(index)
        if self.beams > 1:  # rows stay within their sentence: the per-sentence K/V still apply
            return
        for cache in self.cross_attn:
            cache.reorder(index)
        if self.memory_pad_mask is not None:
            self.memory_pad_mask = self.memory_pad_mask.index_select(0, index)
