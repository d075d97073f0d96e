"""Batched greedy decoding on the decoder's KV cache, and the one-token-a-row loop it shares with
sampling (:mod:`transformer.decoding.sampling`).

Length rules are beam search's: a sentence gets between ``min_len`` and
``max_len_a * src_len + max_len_b`` tokens before its eos (its own source length, without padding;
capped by the model's positions), eos being forced at the limit; bos and pad are never produced.
As in beam search, the one host synchronisation of a step reads how many sentences finished.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from transformer.decoding.options import DecodeOptions
from transformer.decoding.step import (
    Hypothesis,
    Models,
    Stepper,
    as_ensemble,
    ban_repeated_ngrams,
    evaluating,
    sentence_max_lengths,
)
from transformer.masks import padding_mask

# (lprobs (n, V), the live rows' indices in the batch (n,), tokens generated so far) -> (n,) ids
TokenChoice = Callable[[Tensor, Tensor, int], Tensor]


@torch.no_grad()
def greedy_decode(
    model: Models,
    src: Tensor,
    options: DecodeOptions,
    *,
    bos_id: int,
    eos_id: int,
    src_pad_mask: Tensor | None = None,
    max_lengths: Tensor | None = None,
    use_cache: bool = True,
) -> list[list[Hypothesis]]:
    """Translate ``src`` (B, S); return each sentence's one hypothesis.

    ``model``: one model, or a list of them decoded as an ensemble (their mean probabilities).
    From ``options``: the length rules, ``no_repeat_ngram_size`` and ``len_penalty`` (of the
    score only). A finished sentence leaves the batch (its cache rows too). ``max_lengths`` (B,)
    sets each sentence's maximum instead of ``max_len_a`` and ``max_len_b``. Runs in eval mode,
    restoring the mode the model was in.
    """
    rows = decode_rows(
        model, src, options, _likeliest, bos_id=bos_id, eos_id=eos_id, src_pad_mask=src_pad_mask,
        max_lengths=max_lengths, use_cache=use_cache,
    )  # fmt: skip
    return [[h] for h in rows]


def _likeliest(lprobs: Tensor, rows: Tensor, t: int) -> Tensor:
    return lprobs.argmax(-1)  # (n,)


def decode_rows(
    model: Models,
    src: Tensor,
    options: DecodeOptions,
    choose: TokenChoice,
    *,
    bos_id: int,
    eos_id: int,
    src_pad_mask: Tensor | None,
    max_lengths: Tensor | None,
    use_cache: bool,
) -> list[Hypothesis]:
    """One hypothesis per row of ``src`` (B, S), its tokens chosen one a step by ``choose`` from
    the step's log-probabilities (banned ids at -inf); score: their log-probability, eos
    included, / length ** ``options.len_penalty``."""
    models = as_ensemble(model)
    pad_id, min_len = models[0].cfg.pad_id, options.min_len
    if src_pad_mask is None:
        src_pad_mask = padding_mask(src, pad_id)
    max_len = sentence_max_lengths(models, src_pad_mask, options, max_lengths)
    B, steps = src.size(0), int(max_len.max()) + 1
    out = torch.full((B, steps), pad_id, device=src.device)
    total = torch.zeros(B, device=src.device)  # (B,) log-probability so far
    with evaluating(*models):
        stepper = Stepper(models, src, src_pad_mask, use_cache)
        sentence = torch.arange(B, device=src.device)  # (n,) the unfinished ones' rows in `out`
        prefixes = torch.full((B, 1), bos_id, device=src.device)  # (n, t + 1)
        never = torch.tensor([pad_id, bos_id], device=src.device)  # ids never generated
        too_soon = torch.tensor([pad_id, bos_id, eos_id], device=src.device)  # before min_len
        for t in range(steps):  # t tokens generated so far
            lprobs = stepper.log_probs(prefixes)  # (n, V)
            lprobs.index_fill_(1, too_soon if t < min_len else never, float("-inf"))
            lprobs = ban_repeated_ngrams(lprobs, prefixes[:, 1:], options.no_repeat_ngram_size)
            token = choose(lprobs, sentence, t).masked_fill(t >= max_len, eos_id)  # (n,)
            out[sentence, t] = token
            total[sentence] += lprobs.gather(1, token.unsqueeze(1)).squeeze(1)
            prefixes = torch.cat([prefixes, token.unsqueeze(1)], dim=1)
            n, n_done = token.size(0), int(token.eq(eos_id).sum())  # the step's one sync
            if n_done == n:
                break
            if n_done:  # finished rows leave the batch
                keep = token.ne(eos_id).nonzero_static(size=n - n_done).squeeze(1)  # (n',)
                stepper.reorder(keep)
                sentence, prefixes, max_len = sentence[keep], prefixes[keep], max_len[keep]
    hyps = []
    for row, score in zip(out[:, : t + 1].tolist(), total.tolist(), strict=True):
        length = row.index(eos_id)
        hyps.append(Hypothesis(row[:length], score / (length + 1) ** options.len_penalty))
    return hyps
