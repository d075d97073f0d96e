"""Key/value caches for incremental decoding.

A :class:`KVCache` belongs to one attention module. Self-attention appends the new step's keys and
values; cross-attention fills it once from the encoder output and then only reads it. One
``reorder(index)`` contract serves beam search: keep batch (times beam) rows ``index``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


class KVCache:
    """Keys and values of one attention module, read as ``k`` and ``v``, each (B, Hkv, T, Dh).

    Both live in one time-major buffer, (capacity, 2, B, Hkv, Dh), with room for more steps:
    ``append`` writes only the new steps (doubling the buffer when it is full), and ``reorder``
    copies the cached steps once, into a spare buffer that then takes the first one's place, so
    no step copies the whole cache (BENCHMARKS.md, "Decoding: beam search, cached vs uncached vs
    MarianMTModel"). ``k`` and ``v`` are strided views of the buffer, valid until the next
    ``append`` or ``reorder``.

    Meant for incremental decoding under ``torch.no_grad()``: with gradients on, the in-place writes
    leave backward an error about modified tensors rather than wrong gradients.
    """

    def __init__(self, k: Tensor | None = None, v: Tensor | None = None) -> None:
        self.length = 0
        self._buf: Tensor | None = None  # (capacity, 2, B, Hkv, Dh)
        self._spare: Tensor | None = None  # the same shape: reorder's destination
        if k is not None and v is not None:
            self.append(k, v)

    @property
    def k(self) -> Tensor | None:
        return None if self._buf is None else self._buf[: self.length, 0].permute(1, 2, 0, 3)

    @property
    def batch_size(self) -> int:
        return 0 if self._buf is None else self._buf.size(2)

    @property
    def v(self) -> Tensor | None:
        return None if self._buf is None else self._buf[: self.length, 1].permute(1, 2, 0, 3)

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add the new steps' (B, Hkv, t, Dh) keys and values; return all cached so far."""
        n, t = self.length, k.size(2)
        if self._buf is None or n + t > self._buf.size(0):
            capacity = 2 * (n + t) if n else max(t, 16)  # one step at a time: room to grow
            buf = k.new_empty(capacity, 2, *k.shape[:2], k.size(3))
            if self._buf is not None:
                buf[:n] = self._buf[:n]
            self._buf, self._spare = buf, None
        self._buf[n : n + t, 0] = k.permute(2, 0, 1, 3)
        self._buf[n : n + t, 1] = v.permute(2, 0, 1, 3)
        self.length = n + t
        return self.k, self.v

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` (B',), in that order: beam search's survivors."""
        if self._buf is None:
            return
        n = self.length
        if self._buf.requires_grad:  # out= records no gradients: select into a new buffer
            self._buf, self._spare = self._buf[:n].index_select(2, index), None
            return
        if self._spare is None or self._spare.size(2) != index.size(0):
            shape = list(self._buf.shape)
            shape[2] = index.size(0)
            self._spare = self._buf.new_empty(shape)
        torch.index_select(self._buf[:n], 2, index, out=self._spare[:n])
        self._buf, self._spare = self._spare, self._buf


@dataclass
class DecoderCache:
    """Everything the decoder needs between steps, made by ``Transformer.init_cache``.

    Per decoder layer: the self-attention cache (grows one step per call) and the cross-attention
    cache (the encoder output's keys and values, computed once). With a cache the decoder needs no
    encoder output: the source padding mask lives here too, so ``reorder`` keeps them in step.

    Beam search calls ``expand_beams(k)`` after its first step: each row then becomes ``k``
    consecutive decoder rows (its beams), and the cross-attention keys/values stay at one copy per
    sentence (queries of a sentence's beams attend to it together). From then on ``reorder`` keeps
    every row within its sentence's block of ``k`` rows, as beam search does, and names the
    sentences it keeps when finished ones leave the batch.
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
        """Let each row become ``k`` consecutive rows, its sentence's beams (once)."""
        if self.beams != 1:
            raise ValueError("expand_beams comes once")
        for cache in self.self_attn:
            if cache.length and k > 1:
                rows = torch.arange(cache.batch_size, device=cache.k.device)
                cache.reorder(rows.repeat_interleave(k))
        self.beams = k

    def reorder(self, index: Tensor, sentences: Tensor | None = None) -> None:
        """Keep decoder rows ``index`` (N',) in that order.

        With one row per sentence the rows are the sentences, and ``sentences`` is ignored. With
        beams, rows must stay within their sentence's block; ``sentences`` (B',) are the sentences
        kept, in the order of their blocks in ``index`` (None: all of them, in order).
        """
        for cache in self.self_attn:
            cache.reorder(index)
        if self.beams == 1:
            sentences = index
        if sentences is None:
            return
        for cache in self.cross_attn:
            cache.reorder(sentences)
        if self.memory_pad_mask is not None:
            self.memory_pad_mask = self.memory_pad_mask.index_select(0, sentences)
