"""One decoding step for a batch of prefixes, with or without the KV cache.

Searches (greedy, beam) see only :class:`Stepper`: ``log_probs(prefixes)`` gives the next-token
log-probabilities of each row and ``reorder(index)`` keeps the rows that survive, so the cached and
the uncached paths are interchangeable (and compared in tests and benchmarks).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from transformer.model import Transformer


@contextmanager
def evaluating(model: nn.Module) -> Iterator[None]:
    """Eval mode (no dropout) inside, the model's previous mode restored after."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


class Stepper:
    """Next-token log-probabilities of ``model`` for prefixes of ``src`` rows.

    With ``use_cache`` the encoder output's cross-attention K/V are computed once and each call
    feeds only the newest token; without it every call re-runs the decoder over the whole prefix.
    """

    def __init__(
        self, model: Transformer, src: Tensor, src_pad_mask: Tensor, use_cache: bool = True
    ) -> None:
        self.model = model
        self.memory = model.encode(src, src_pad_mask)  # (B, S, D)
        self.memory_pad_mask = src_pad_mask
        self.cache = model.init_cache(self.memory, src_pad_mask) if use_cache else None

    def expand_beams(self, k: int) -> None:
        """Make ``k`` consecutive rows (beams) of every row: beam search after its first step.

        Cached, the encoder's keys and values stay at one copy per sentence (see
        ``DecoderCache.expand_beams``); uncached, the encoder output itself is repeated.
        """
        if self.cache is not None:
            self.cache.expand_beams(k)
        else:
            rows = torch.arange(self.memory.size(0), device=self.memory.device)
            self.reorder(rows.repeat_interleave(k))

    def reorder(self, index: Tensor, sentences: Tensor | None = None) -> None:
        """Keep rows ``index`` (N',) in that order; rows may repeat (beams of one sentence).
        With beams, ``sentences`` (B',) are the sentences kept when some leave (see
        ``DecoderCache.reorder``)."""
        if self.cache is not None:
            self.cache.reorder(index, sentences)
        else:
            self.memory = self.memory.index_select(0, index)
            self.memory_pad_mask = self.memory_pad_mask.index_select(0, index)

    def log_probs(self, prefixes: Tensor) -> Tensor:
        """prefixes (N, t), bos first, the same t for all rows -> (N, V) log-probabilities."""
        if self.cache is not None:
            if self.cache.offset != prefixes.size(1) - 1:
                raise ValueError("the cache holds a different number of steps than the prefixes")
            logits = self.model.decode(prefixes[:, -1:], cache=self.cache)  # (N, 1, V)
        else:
            logits = self.model.decode(prefixes, self.memory, self.memory_pad_mask)  # (N, t, V)
        return torch.log_softmax(logits[:, -1].float(), dim=-1)
