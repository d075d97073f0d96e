"""Sampling: each token drawn from the model's (or ensemble's) next-token distribution, tempered
and truncated to the top-k likeliest tokens and then to the top-p nucleus, on greedy decoding's
batched, cached loop (:func:`transformer.decoding.greedy.decode_rows`).

The draws are reproducible and independent of the batch: the number that picks a row's token at
step t is a hash of (``seed``, the sentence's index, the sample's index, t), computed on the
device (splitmix64, Steele et al. 2014, on int64 tensors), not the next number of a generator that
the rows would share. So a sentence gets the same samples alone or in any batch, in any order, and
a stream of lines resumed halfway gets the ones an uninterrupted run gets, as long as the model's
probabilities are the same to the last bit (batched and single-row matrix products can differ in
it, which moves a draw only when it falls within that difference of a token's boundary).
"""

from __future__ import annotations

import torch
from torch import Tensor

from transformer.decoding.greedy import decode_rows
from transformer.decoding.options import DecodeOptions
from transformer.decoding.step import Hypothesis, Models


def _signed(x: int) -> int:
    """A 64-bit pattern as the int64 that holds it."""
    x &= (1 << 64) - 1
    return x - (1 << 64) if x >> 63 else x


GOLDEN = _signed(0x9E3779B97F4A7C15)  # splitmix64's increment
MULTIPLIERS = (_signed(0xBF58476D1CE4E5B9), _signed(0x94D049BB133111EB))


def _shr(x: Tensor, n: int) -> Tensor:
    """Logical right shift of int64 bit patterns (torch's ``>>`` is arithmetic)."""
    return (x >> n) & ((1 << (64 - n)) - 1)


def mix64(x: Tensor) -> Tensor:
    """splitmix64's finaliser on int64 tensors: a bijection of 64-bit patterns that scatters
    nearby inputs (multiplication wraps around, as on the CPU and GPU)."""
    x = (x ^ _shr(x, 30)) * MULTIPLIERS[0]
    x = (x ^ _shr(x, 27)) * MULTIPLIERS[1]
    return x ^ _shr(x, 31)


def streams(seed: int, sentences: Tensor, samples: Tensor) -> Tensor:
    """(N,) int64 starting states, one per (sentence index, sample index) pair, under ``seed``."""
    seeded = mix64(torch.full_like(sentences, _signed(seed)))
    return mix64(mix64(sentences ^ seeded) + samples)


def uniforms(states: Tensor, t: int | Tensor) -> Tensor:
    """(N,) float64 numbers in [0, 1): the t-th output of each row's splitmix64 stream; ``t`` an
    int, or a (1,) int64 tensor on the device (a static step: the product wraps around there)."""
    step = _signed((t + 1) * GOLDEN) if isinstance(t, int) else (t + 1) * GOLDEN
    return _shr(mix64(states + step), 11).double() * 2.0**-53


def sample_tokens(
    lprobs: Tensor, u: Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0
) -> Tensor:
    """(n, V) log-probabilities (banned ids at -inf) and (n,) float64 numbers in [0, 1) -> (n,)
    ids.

    The distribution: softmax(lprobs / temperature), kept to its ``top_k`` likeliest ids (0 =
    all), then to the fewest likeliest ids whose probability adds up to at least ``top_p`` of
    what is kept, renormalised. The id drawn is the first whose cumulative probability exceeds
    ``u`` times the total (inverse transform sampling); summed in float64, that total exceeds any
    ``u`` times it, so an id of probability 0 (banned, or cut off) is never drawn. With top-k the
    sums run over the k ids only; top-p alone sorts the vocabulary.
    """
    logits = lprobs / temperature  # (n, V)
    ids = None  # the vocabulary's order, unless ranked
    if 0 < top_k < logits.size(-1):
        logits, ids = logits.topk(top_k)  # (n, k), likeliest first
    elif top_p < 1:
        logits, ids = logits.sort(-1, descending=True)  # (n, V)
    probs = logits.softmax(-1).double()
    if top_p < 1:  # ranked: keep an id while the likelier ones hold less than top_p
        probs = probs.masked_fill(probs.cumsum(-1) - probs >= top_p, 0.0)
    cdf = probs.cumsum(-1)
    drawn = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(1), right=True)  # (n, 1)
    return (drawn if ids is None else ids.gather(1, drawn)).squeeze(1)


@torch.no_grad()
def sample(
    model: Models,
    src: Tensor,
    options: DecodeOptions,
    *,
    bos_id: int,
    eos_id: int,
    src_pad_mask: Tensor | None = None,
    max_lengths: Tensor | None = None,
    use_cache: bool = True,
    sentence_ids: Tensor | None = None,
    target_prefix: Tensor | None = None,
) -> list[list[Hypothesis]]:
    """Each sentence of ``src`` (B, S): ``options.nbest`` samples, the best score first.

    ``sentence_ids`` (B,) name the sentences for the random draws (default 0..B-1): a line's
    number in its file gives it the same samples in any batch. Sample j of a sentence is the same
    whatever ``nbest`` (j < nbest). Length rules, banned n-grams and scores as greedy decoding's
    (:func:`transformer.decoding.greedy.decode_rows`); each sample is a row of its own, after
    its sentence's ``target_prefix`` (B, P) (:mod:`transformer.decoding.prefix`).
    """
    B, N = src.size(0), options.nbest
    sentences = torch.arange(B, device=src.device) if sentence_ids is None else sentence_ids
    sentences = sentences.to(src.device, torch.long).repeat_interleave(N)  # (B * N,)
    samples = torch.arange(N, device=src.device).repeat(B)  # (B * N,)
    if N > 1:  # each sample a row of its own
        src = src.repeat_interleave(N, dim=0)
        if src_pad_mask is not None:
            src_pad_mask = src_pad_mask.repeat_interleave(N, dim=0)
        if max_lengths is not None:
            max_lengths = max_lengths.repeat_interleave(N)
        if target_prefix is not None:
            target_prefix = target_prefix.repeat_interleave(N, dim=0)
    states = streams(options.seed, sentences, samples)
    states = torch.cat([states, states[:1]])  # row B * N: a padding row's (its tokens ignored)

    def draw(lprobs: Tensor, rows: Tensor, t: int | Tensor) -> Tensor:
        u = uniforms(states[rows], t)
        return sample_tokens(lprobs, u, options.temperature, options.top_k, options.top_p)

    rows = decode_rows(
        model, src, options, draw, bos_id=bos_id, eos_id=eos_id, src_pad_mask=src_pad_mask,
        max_lengths=max_lengths, use_cache=use_cache, target_prefix=target_prefix,
    )  # fmt: skip
    return [sorted(rows[i * N : (i + 1) * N], key=lambda h: -h.score) for i in range(B)]
