"""Key/value caches for incremental decoding.

A :class:`KVCache` belongs to one attention module. Self-attention writes each step's keys and
values into it; cross-attention fills it once from the encoder output and then only reads it. A
:class:`DecoderCache` holds a decoder's caches and the masks decoding builds once, and one
``reorder(index, sentences)`` contract serves beam search: keep batch (times beam) rows ``index``.
With a capacity, the caches of a decoder's layers share buffers (:mod:`transformer.kv_slabs`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from transformer.kv_slabs import Slab, make_slabs
from transformer.masks import padding_bias, positions_bias


class KVCache:
    """Keys and values of one attention module, read as ``k`` and ``v``, each (B, Hkv, T, Dh),
    and ``bias``: the additive mask over those keys that decoding builds once (None: every key
    may be seen; see ``transformer.masks``).

    Both live in one time-major buffer, (capacity, 2, B, Hkv, Dh): a step writes only its own
    keys and values, and ``reorder`` copies the cached steps once, into a spare buffer that then
    takes the first one's place. ``k`` and ``v`` are strided views of the buffer, valid until the
    next write or reorder. Given a ``capacity`` (the most steps a search will take) the buffer is
    allocated once; without one it doubles when full.

    Static (``position`` set by :class:`DecoderCache`, a (1,) tensor on the device): ``write``
    puts the step at ``position``, ``k`` and ``v`` cover the whole capacity and ``bias`` hides
    the positions not written yet, so that every step has the same shapes and addresses (what a
    CUDA graph replays). ``length``, the steps written so far, is then advanced by the cache's
    owner, since a graph replay runs no Python.

    Meant for incremental decoding under ``torch.no_grad()``: with gradients on, the in-place writes
    leave backward an error about modified tensors rather than wrong gradients.
    """

    def __init__(
        self, k: Tensor | None = None, v: Tensor | None = None, *, capacity: int | None = None
    ) -> None:
        self.length = 0
        self.capacity = capacity
        self.position: Tensor | None = None  # (1,) static: where the step goes
        self.bias: Tensor | None = None  # (B or 1, 1, 1, T) additive mask over the keys
        self._buf: Tensor | None = None  # (capacity, 2, B, Hkv, Dh)
        self._spare: Tensor | None = None  # the same shape: reorder's destination
        if k is not None and v is not None:
            self.append(k, v)

    @property
    def k(self) -> Tensor | None:
        return None if self._buf is None else self._view(0)

    @property
    def v(self) -> Tensor | None:
        return None if self._buf is None else self._view(1)

    def _view(self, i: int) -> Tensor:
        steps = self._buf.size(0) if self.position is not None else self.length
        return self._buf[:steps, i].permute(1, 2, 0, 3)  # (B, Hkv, T, Dh)

    @property
    def batch_size(self) -> int:
        return 0 if self._buf is None else self._buf.size(2)

    def _reserve(self, t: int, like: Tensor) -> None:
        """Room for ``t`` more steps of keys like ``like`` (t, B, Hkv, Dh)."""
        n = self.length
        if self._buf is not None and n + t <= self._buf.size(0):
            return
        if self.capacity is not None and n + t > self.capacity:
            raise ValueError(f"a cache of {self.capacity} steps cannot take {n + t}")
        capacity = self.capacity or (2 * (n + t) if n else max(t, 16))  # room to grow
        buf = like.new_empty(capacity, 2, *like.shape[1:])
        if self._buf is not None:
            buf[:n] = self._buf[:n]
        self._buf, self._spare = buf, None

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add the new steps' (B, Hkv, t, Dh) keys and values; return all cached so far."""
        n, t = self.length, k.size(2)
        k, v = k.permute(2, 0, 1, 3), v.permute(2, 0, 1, 3)  # (t, B, Hkv, Dh)
        self._reserve(t, k)
        self._buf[n : n + t, 0] = k
        self._buf[n : n + t, 1] = v
        self.length = n + t
        return self.k, self.v

    def write(self, kv: Tensor) -> tuple[Tensor, Tensor]:
        """Add the new steps' keys and values as one projection gives them, (B, t, 2, Hkv, Dh),
        with one copy; return all cached so far (static: at ``position``, one step)."""
        kv = kv.permute(1, 2, 0, 3, 4)  # (t, 2, B, Hkv, Dh)
        if self.position is not None:
            self._buf.index_copy_(0, self.position, kv)
        else:
            n, t = self.length, kv.size(0)
            self._reserve(t, kv[:, 0])
            self._buf[n : n + t] = kv
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

    Per decoder layer: the self-attention cache (one step written per call) and the
    cross-attention cache (the encoder output's keys and values, computed once, with the source
    padding as an additive mask, built once). With a cache the decoder needs no encoder output.

    With a ``capacity`` (the most steps the search will take) the self-attention buffers of all
    layers are allocated once and reordered together. ``static`` (which needs a capacity): every
    step reads all of it behind a length mask and writes at the device position ``position``,
    so that its shapes and addresses never change (CUDA graphs); :meth:`advance` counts the
    steps taken.

    Beam search calls ``expand_beams(k)`` after its first step: each row then becomes ``k``
    consecutive decoder rows (its beams), and the cross-attention keys/values stay at one copy per
    sentence (queries of a sentence's beams attend to it together). From then on ``reorder`` keeps
    every row within its sentence's block of ``k`` rows, as beam search does, and names the
    sentences it keeps when finished ones leave the batch.
    """

    self_attn: list[KVCache]
    cross_attn: list[KVCache]
    beams: int = 1  # decoder rows per source row
    position: Tensor | None = None  # (1,) static: the position of the step being decoded
    pinned: bool = False  # reorders keep the buffers' addresses (a CUDA graph reads them)
    _self_slabs: list[Slab] = field(default_factory=list)
    _cross_slabs: list[Slab] = field(default_factory=list)
    _steps_bias: Tensor | None = None  # (capacity, capacity) static: row t masks keys after t

    @classmethod
    def empty(
        cls,
        cross_kv: list[tuple[Tensor, Tensor]],
        memory_pad_mask: Tensor | None,
        self_shapes: list[tuple[int, int]],
        capacity: int | None = None,
        static: bool = False,
    ) -> DecoderCache:
        """A cache over each layer's cross-attention keys and values (B, Hkv, S, Dh), whose
        self-attention caches hold ``self_shapes``' (Hkv, Dh) per layer."""
        if static and capacity is None:
            raise ValueError("a static cache needs a capacity")
        like = cross_kv[0][0]
        rows, S = like.size(0), like.size(2)
        cross = [KVCache() for _ in cross_kv]
        cross_slabs = make_slabs(
            cross, [(k.size(1), k.size(3)) for k, _ in cross_kv], rows, S, like
        )
        for cache, (k, v) in zip(cross, cross_kv, strict=True):
            cache.append(k, v)
        if memory_pad_mask is not None:
            bias = padding_bias(memory_pad_mask, like.dtype)  # (B, 1, 1, S)
            for cache in cross:
                cache.bias = bias
        caches = [KVCache(capacity=capacity) for _ in self_shapes]
        cache = cls(caches, cross, _cross_slabs=cross_slabs)
        if capacity is not None:
            cache._self_slabs = make_slabs(caches, self_shapes, rows, capacity, like, static)
        if static:
            cache.position = torch.zeros(1, dtype=torch.long, device=like.device)
            cache._steps_bias = positions_bias(capacity, like.dtype, like.device)
            for c in caches:
                c.position = cache.position
        return cache

    @property
    def offset(self) -> int:
        """Target positions decoded so far: the position of the next token."""
        return self.self_attn[0].length

    @property
    def static(self) -> bool:
        return self.position is not None

    def step_positions(self, steps: int) -> int | Tensor:
        """The position of this call's first new token, for the embedding: the host offset, or
        (static, one step) the device position, with the step's length mask set on every
        self-attention cache (one ``index_select``, inside a graph)."""
        if not self.static:
            return self.offset
        if steps != 1:
            raise ValueError("a static cache decodes one step a call")
        bias = self._steps_bias.index_select(0, self.position)[:, None, None]  # (1, 1, 1, T)
        for cache in self.self_attn:
            cache.bias = bias
        return self.position

    def advance(self) -> None:
        """Static: count the step just decoded (its keys and values are written)."""
        for cache in self.self_attn:
            cache.length += 1

    def expand_beams(self, k: int) -> None:
        """Let each row become ``k`` consecutive rows, its sentence's beams (once)."""
        if self.beams != 1:
            raise ValueError("expand_beams comes once")
        if (self.offset or self.static) and k > 1:  # (static: its buffers have every row)
            rows = torch.arange(self.self_attn[0].batch_size, device=self.cross_attn[0].k.device)
            self._reorder_rows(rows.repeat_interleave(k))
        self.beams = k

    def _reorder_rows(self, index: Tensor) -> None:
        if self._self_slabs:
            for slab in self._self_slabs:
                slab.reorder(index, self.offset, self.pinned)
        else:
            for cache in self.self_attn:
                cache.reorder(index)

    def reorder_in_place(self, index: Tensor) -> None:
        """Static: keep decoder rows ``index`` (N,), as many rows as there are, each within its
        sentence's block, over the whole capacity, in place: no step count read on the host and
        no buffer moved (a whole search step that a CUDA graph replays)."""
        for slab in self._self_slabs:
            slab.reorder(index, slab.buf.size(0), pinned=True)

    def reorder(self, index: Tensor, sentences: Tensor | None = None) -> None:
        """Keep decoder rows ``index`` (N',) in that order.

        With one row per sentence the rows are the sentences, and ``sentences`` is ignored. With
        beams, rows must stay within their sentence's block; ``sentences`` (B',) are the sentences
        kept, in the order of their blocks in ``index`` (None: all of them, in order).
        """
        self._reorder_rows(index)
        if self.beams == 1:
            sentences = index
        if sentences is None:
            return
        for slab in self._cross_slabs:
            slab.reorder(sentences, slab.buf.size(0), self.pinned)
        bias = self.cross_attn[0].bias
        if bias is not None:
            bias = bias.index_select(0, sentences)
            for cache in self.cross_attn:
                cache.bias = bias
