"""One decoding step for a batch of prefixes, with or without the KV cache, and the rules both
searches apply at each step: output length limits, banned n-grams.

Searches (greedy, beam) see only :class:`Stepper`: ``log_probs(prefixes)`` gives the next-token
log-probabilities of each row and ``reorder(index)`` keeps the rows that survive, so the cached and
the uncached paths are interchangeable (and compared in tests and benchmarks).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from transformer.decoding.options import DecodeOptions
from transformer.model import Transformer


@dataclass
class Hypothesis:
    """One translation of a sentence, as both searches return it."""

    tokens: list[int]  # generated ids, without bos and eos
    score: float | None  # beam: log-prob. (eos included) / length ** len_penalty; greedy: None


def max_output_lengths(
    src_lens: Tensor,
    max_len_a: float,
    max_len_b: int,
    min_len: int,
    cap: int,
    max_lengths: Tensor | None = None,
) -> Tensor:
    """(B,) most tokens before eos per sentence: ``a * src_len + b`` (or the given
    ``max_lengths``) within [min_len, cap]."""
    if max_lengths is None:
        lengths = (src_lens.float() * max_len_a).floor().long() + max_len_b
    else:
        lengths = max_lengths.to(src_lens.device, torch.long)
    return lengths.clamp(min=min(min_len, cap), max=cap)


def sentence_max_lengths(
    model: Transformer, src_pad_mask: Tensor, options: DecodeOptions, max_lengths: Tensor | None
) -> Tensor:
    """(B,) most tokens before eos for each source row, within the model's positions (the
    decoder reads bos and every token but eos): :func:`max_output_lengths` of the rows."""
    return max_output_lengths(
        (~src_pad_mask).sum(1), options.max_len_a, options.max_len_b, options.min_len,
        model.cfg.max_positions - 1, max_lengths,
    )  # fmt: skip


def ban_repeated_ngrams(lprobs: Tensor, generated: Tensor, n: int) -> Tensor:
    """Forbid any token that would repeat an n-gram already in ``generated`` (N, t): (N, V)."""
    t = generated.size(1)
    if n <= 0 or t < n:
        return lprobs
    windows = generated.unfold(1, n, 1)  # (N, t - n + 1, n)
    match = (windows[..., :-1] == generated[:, None, t - n + 1 :]).all(-1)  # (N, t - n + 1)
    banned = torch.zeros_like(lprobs).scatter_add_(1, windows[..., -1], match.to(lprobs.dtype))
    return lprobs.masked_fill(banned > 0, float("-inf"))


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
