"""The buffers a decoder's KV caches share when their capacity is known: one per (Hkv, Dh) shape
of layer, holding every such layer's keys and values, so that beam search reorders all of them
with one ``index_select`` and no step allocates (:class:`transformer.kv_cache.DecoderCache`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from transformer.kv_cache import KVCache


class Slab:
    """One buffer behind the KVCaches of every layer of one shape, (capacity, layers, 2, B, Hkv,
    Dh): a reorder of all of them is one ``index_select``, into a second buffer that then takes
    the first one's place. When sentences leave, the rows that stay fill the front of the second
    buffer (``buf`` is then a view of its first rows), so that no step allocates: only beam
    search's expansion makes the buffers larger."""

    def __init__(self, caches: list[KVCache], buffer: Tensor, zeros: bool) -> None:
        self.caches, self.buf, self.zeros = caches, buffer, zeros  # zeros: a masked key never NaN
        self.stores: list[Tensor | None] = [buffer, None]  # buf's storage, the other
        self._point()

    def _point(self) -> None:
        for layer, cache in enumerate(self.caches):
            cache._buf = self.buf[:, layer]  # (capacity, 2, B, Hkv, Dh)
            cache._spare = None

    def reorder(self, index: Tensor, steps: int, pinned: bool) -> None:
        """Keep batch rows ``index`` of the first ``steps`` steps; ``pinned``: in place where the
        rows stay as many (the buffer keeps its address, as a CUDA graph needs), else through
        the other buffer."""
        rows = index.size(0)
        if pinned and rows == self.buf.size(3):
            self.buf[:steps] = self.buf[:steps].index_select(3, index)
            return
        if self.buf.requires_grad:  # out= records no gradients: select into a new buffer
            self.buf, self.stores = self.buf[:steps].index_select(3, index), [None, None]
            self._point()
            return
        other = self.stores[1]
        if other is None or other.size(3) < rows:
            shape = list(self.buf.shape)
            shape[3] = rows
            other = self.buf.new_zeros(shape) if self.zeros else self.buf.new_empty(shape)
        target = other[:, :, :, :rows]  # (capacity, layers, 2, rows, Hkv, Dh)
        torch.index_select(self.buf[:steps], 3, index, out=target[:steps])
        self.buf, self.stores = target, [other, self.stores[0]]
        self._point()


def make_slabs(
    caches: list[KVCache], shapes: list[tuple[int, int]], rows: int, steps: int, like: Tensor,
    zeros: bool = False,
) -> list[Slab]:  # fmt: skip
    """Buffers of ``steps`` steps for ``caches`` whose (Hkv, Dh) are ``shapes``, one per shape;
    ``zeros``: filled with zeros (a masked key must hold no NaN: 0 x NaN is NaN)."""
    slabs = []
    for shape in dict.fromkeys(shapes):
        group = [c for c, s in zip(caches, shapes, strict=True) if s == shape]
        new = like.new_zeros if zeros else like.new_empty
        slabs.append(Slab(group, new(steps, len(group), 2, rows, *shape), zeros))
    return slabs
