"""One decoding step for a batch of prefixes, with or without the KV cache, for one model or an
ensemble, and the rules every search applies at each step: output length limits and banned
n-grams (how the step runs on its device, :mod:`transformer.decoding.runtime`).

Searches (greedy, beam, sampling) see only :class:`Stepper`: ``log_probs(prefixes)`` gives the
next-token log-probabilities of each row and ``reorder(index)`` keeps the rows that survive, so the
cached and the uncached paths are interchangeable (and compared in tests and benchmarks), and so
are one model and an ensemble.

Off the CPU (``transformer.kernels``) a cached step has static shapes: its cache is allocated
once at the batch's most steps and read behind a length mask, finished sentences leave the batch
only every ``sync_every`` steps, into a few batch sizes
(:func:`transformer.decoding.runtime.batch_size`), and each size's step is a CUDA graph
(:mod:`transformer.decoding.graphs`). On the CPU, where a host read costs nothing and every row
costs its arithmetic, sentences leave as soon as they finish.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from transformer import kernels
from transformer.decoding.graphs import GraphedStep
from transformer.decoding.options import DecodeOptions
from transformer.decoding.runtime import attention_kernel, backend
from transformer.kv_cache import DecoderCache
from transformer.model import Transformer

log = logging.getLogger(__name__)

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
    constraints_met: bool | None = None  # beam search with constraints: it holds every phrase


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


def ban_repeated_ngrams_at(lprobs: Tensor, generated: Tensor, t: Tensor, n: int) -> Tensor:
    """:func:`ban_repeated_ngrams` at static shapes: ``generated`` (N, L) holds the tokens so far
    in its first ``t`` (1,) columns (a device count), padding after; (N, V) -> (N, V)."""
    L = generated.size(1)
    if n <= 0 or L < n:
        return lprobs
    windows = generated.unfold(1, n, 1)  # (N, L - n + 1, n)
    steps = torch.arange(n - 1, device=t.device)
    suffix = generated.index_select(1, (t - n + 1 + steps).clamp(min=0))  # (N, n - 1)
    before = torch.arange(L - n + 1, device=t.device) <= t - n  # (L - n + 1,) windows within t
    match = (windows[..., :-1] == suffix[:, None]).all(-1) & before  # (N, L - n + 1)
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


@functools.cache
def _announce(message: str) -> None:
    log.debug(message)  # (INFO would reach evaluate.py's stdout, where translations go)


class Stepper:
    """Next-token log-probabilities of ``models`` for prefixes of ``src`` rows: one model's, or
    an ensemble's mean of probabilities (:func:`mean_probabilities`), each model with its own
    encoder output and cache.

    With ``use_cache`` the encoder output's cross-attention K/V are computed once and each call
    feeds only the newest token; without it every call re-runs the decoder over the whole prefix.
    ``steps``: the most calls the search will make, the capacity of the cache (allocated once);
    off the CPU its shapes are then static, and with ``graphs`` each step replays a CUDA graph.
    ``whole_step``: the search's whole step runs at static shapes
    (:mod:`transformer.decoding.static`; static caches on the CPU too): it calls :meth:`step`
    and :meth:`reorder_in_place`, which read nothing on the host, and with ``graphs`` it is the
    one CUDA graph (the model's steps get none of their own).
    """

    def __init__(
        self,
        models: Models,
        src: Tensor,
        src_pad_mask: Tensor,
        use_cache: bool = True,
        steps: int | None = None,
        graphs: bool = False,
        whole_step: bool = False,
    ) -> None:
        self.models = as_ensemble(models)
        self.memory = [m.encode(src, src_pad_mask) for m in self.models]  # each (B, S, D)
        self.memory_pad_mask = src_pad_mask
        self.caches, self.graphs = None, None
        if use_cache:
            static = steps is not None and (whole_step or not kernels.cpu_kernels(src))
            pairs = zip(self.models, self.memory, strict=True)
            self.caches = [m.init_cache(mem, src_pad_mask, steps, static) for m, mem in pairs]
            _announce(backend(src, self.memory[0].dtype, static and graphs, whole_step))
            if static and graphs and not whole_step:
                self.graphs = []
                for model, cache in zip(self.models, self.caches, strict=True):
                    cache.pinned = True
                    self.graphs.append(
                        GraphedStep(functools.partial(cached_step, model, cache=cache))
                    )

    def expand_beams(self, k: int) -> None:
        """Make ``k`` consecutive rows (beams) of every row: beam search after its first step.

        Cached, the encoder's keys and values stay at one copy per sentence (see
        ``DecoderCache.expand_beams``); uncached, the encoder output itself is repeated.
        """
        if self.caches is not None:
            for cache in self.caches:
                cache.expand_beams(k)
            for graph in self.graphs or []:
                graph.reset()
        else:
            rows = torch.arange(self.memory_pad_mask.size(0), device=self.memory_pad_mask.device)
            self.reorder(rows.repeat_interleave(k))

    def reorder(self, index: Tensor, sentences: Tensor | None = None) -> None:
        """Keep rows ``index`` (N',) in that order; rows may repeat (beams of one sentence).
        With beams, ``sentences`` (B',) are the sentences kept when some leave (see
        ``DecoderCache.reorder``)."""
        if self.caches is not None:
            for i, cache in enumerate(self.caches):
                if self.graphs is not None and (
                    cache.beams == 1
                    or sentences is not None
                    or index.size(0) != cache.self_attn[0].batch_size
                ):  # the cache's buffers move: the graph of the next size comes next
                    self.graphs[i].reset()
                cache.reorder(index, sentences)
        else:
            self.memory = [mem.index_select(0, index) for mem in self.memory]
            self.memory_pad_mask = self.memory_pad_mask.index_select(0, index)

    def log_probs(self, prefixes: Tensor) -> Tensor:
        """prefixes (N, t), bos first, the same t for all rows -> (N, V) log-probabilities."""
        lprobs = []
        with attention_kernel(prefixes):
            for i, model in enumerate(self.models):
                if self.caches is None:
                    logits = model.decode(prefixes, self.memory[i], self.memory_pad_mask)
                    lprobs.append(torch.log_softmax(logits[:, -1].float(), dim=-1))
                    continue
                cache = self.caches[i]
                if cache.offset != prefixes.size(1) - 1:
                    raise ValueError(
                        "the cache holds a different number of steps than the prefixes"
                    )
                if cache.static:
                    cache.position.fill_(cache.offset)
                if self.graphs is not None:
                    lprobs.append(self.graphs[i](prefixes[:, -1:]))
                else:
                    lprobs.append(cached_step(model, prefixes[:, -1:], cache))
                if cache.static:
                    cache.advance()
        return mean_probabilities(lprobs)

    def step(self, tokens: Tensor, position: Tensor) -> Tensor:
        """Static caches: tokens (N, 1) at the device ``position`` (1,) -> (N, V)
        log-probabilities; the position is copied on the device and no count kept on the host,
        so that a CUDA graph of the whole search step replays it."""
        lprobs = []
        with attention_kernel(tokens):
            for model, cache in zip(self.models, self.caches, strict=True):
                cache.position.copy_(position)
                lprobs.append(cached_step(model, tokens, cache))
        return mean_probabilities(lprobs)

    def reorder_in_place(self, index: Tensor) -> None:
        """Static caches: keep rows ``index`` (N,), as many as there are, within their sentences
        (``DecoderCache.reorder_in_place``)."""
        for cache in self.caches:
            cache.reorder_in_place(index)


def cached_step(model: Transformer, tokens: Tensor, cache: DecoderCache) -> Tensor:
    """tokens (N, 1) after the cached steps -> (N, V) float32 log-probabilities."""
    return torch.log_softmax(model.decode(tokens, cache=cache)[:, -1].float(), dim=-1)
