"""One decoding step for a batch of prefixes, with or without the KV cache, for one model or an
ensemble, and the rules every search applies at each step: output length limits, banned n-grams.

Searches (greedy, beam, sampling) see only :class:`Stepper`: ``log_probs(prefixes)`` gives the
next-token log-probabilities of each row and ``reorder(index)`` keeps the rows that survive, so the
cached and the uncached paths are interchangeable (and compared in tests and benchmarks), and so
are one model and an ensemble.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from transformer.decoding.options import DecodeOptions
from transformer.model import Transformer

Models = Transformer | Sequence[Transformer]  # one model, or an ensemble


def as_ensemble(models: Models) -> list[Transformer]:
    """The models as a list; an ensemble's must share the target vocabulary and padding id."""
    models = [models] if isinstance(models, nn.Module) else list(models)
    if not models:
        raise ValueError("an ensemble needs at least one model")
    first = models[0].cfg
    for m in models[1:]:
        if (m.cfg.tgt_vocab_size, m.cfg.pad_id) != (first.tgt_vocab_size, first.pad_id):
            raise ValueError(
                "ensembled models need one target vocabulary and pad id: "
                f"{m.cfg.tgt_vocab_size}/{m.cfg.pad_id} against "
                f"{first.tgt_vocab_size}/{first.pad_id}"
            )
    return models


def mean_probabilities(lprobs: Sequence[Tensor]) -> Tensor:
    """log(mean of the models' probabilities), as fairseq's ensemble: (N, ...) log-probabilities
    of each model -> (N, ...). One model's are returned as they are."""
    if len(lprobs) == 1:
        return lprobs[0]
    return torch.logsumexp(torch.stack(lprobs), dim=0) - math.log(len(lprobs))


@dataclass
class Hypothesis:
    """One translation of a sentence, as both searches return it."""

    tokens: list[int]  # generated ids, without bos and eos
    score: float | None  # log-probability (eos included) / length (eos included) ** len_penalty


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
    models: Sequence[Transformer],
    src_pad_mask: Tensor,
    options: DecodeOptions,
    max_lengths: Tensor | None,
) -> Tensor:
    """(B,) most tokens before eos for each source row, within every model's positions (the
    decoder reads bos and every token but eos): :func:`max_output_lengths` of the rows."""
    return max_output_lengths(
        (~src_pad_mask).sum(1), options.max_len_a, options.max_len_b, options.min_len,
        min(m.cfg.max_positions for m in models) - 1, max_lengths,
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
def evaluating(*models: nn.Module) -> Iterator[None]:
    """Eval mode (no dropout) inside, each model's previous mode restored after."""
    with ExitStack() as stack:
        for model in models:
            stack.callback(model.train, model.training)
            model.eval()
        yield


class Stepper:
    """Next-token log-probabilities of ``models`` for prefixes of ``src`` rows: one model's, or
    an ensemble's mean of probabilities (:func:`mean_probabilities`), each model with its own
    encoder output and cache.

    With ``use_cache`` the encoder output's cross-attention K/V are computed once and each call
    feeds only the newest token; without it every call re-runs the decoder over the whole prefix.
    """

    def __init__(
        self, models: Models, src: Tensor, src_pad_mask: Tensor, use_cache: bool = True
    ) -> None:
        self.models = as_ensemble(models)
        self.memory = [m.encode(src, src_pad_mask) for m in self.models]  # each (B, S, D)
        self.memory_pad_mask = src_pad_mask
        pairs = zip(self.models, self.memory, strict=True)
        self.caches = [m.init_cache(mem, src_pad_mask) for m, mem in pairs] if use_cache else None

    def expand_beams(self, k: int) -> None:
        """Make ``k`` consecutive rows (beams) of every row: beam search after its first step.

        Cached, the encoder's keys and values stay at one copy per sentence (see
        ``DecoderCache.expand_beams``); uncached, the encoder output itself is repeated.
        """
        if self.caches is not None:
            for cache in self.caches:
                cache.expand_beams(k)
        else:
            rows = torch.arange(self.memory_pad_mask.size(0), device=self.memory_pad_mask.device)
            self.reorder(rows.repeat_interleave(k))

    def reorder(self, index: Tensor, sentences: Tensor | None = None) -> None:
        """Keep rows ``index`` (N',) in that order; rows may repeat (beams of one sentence).
        With beams, ``sentences`` (B',) are the sentences kept when some leave (see
        ``DecoderCache.reorder``)."""
        if self.caches is not None:
            for cache in self.caches:
                cache.reorder(index, sentences)
        else:
            self.memory = [mem.index_select(0, index) for mem in self.memory]
            self.memory_pad_mask = self.memory_pad_mask.index_select(0, index)

    def log_probs(self, prefixes: Tensor) -> Tensor:
        """prefixes (N, t), bos first, the same t for all rows -> (N, V) log-probabilities."""
        lprobs = []
        for i, model in enumerate(self.models):
            if self.caches is not None:
                cache = self.caches[i]
                if cache.offset != prefixes.size(1) - 1:
                    raise ValueError(
                        "the cache holds a different number of steps than the prefixes"
                    )
                logits = model.decode(prefixes[:, -1:], cache=cache)  # (N, 1, V)
            else:
                logits = model.decode(prefixes, self.memory[i], self.memory_pad_mask)  # (N, t, V)
            lprobs.append(torch.log_softmax(logits[:, -1].float(), dim=-1))
        return mean_probabilities(lprobs)
