"""Batched greedy decoding on the decoder's KV cache, and the one-token-a-row loop it shares with
sampling (:mod:`transformer.decoding.sampling`).

Length rules are beam search's: a sentence gets between ``min_len`` and
``max_len_a * src_len + max_len_b`` tokens before its eos (its own source length, without padding;
capped by the model's positions), eos being forced at the limit; bos and pad are never produced.
As in beam search, the one host synchronisation reads how many sentences finished (every
``sync_every`` steps off the CPU; rows past their eos wait until then, adding nothing), and
finished rows leave the batch; or, with ``decode.static_search`` (off by default), they stay to
the end, each step one whole step at static shapes
(:mod:`transformer.decoding.static`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from transformer.decoding import static
from transformer.decoding.hooks import SearchHook
from transformer.decoding.options import DecodeOptions
from transformer.decoding.runtime import sync_interval, use_graphs, use_static_search
from transformer.decoding.search import count_done, live_rows, search_hooks, search_inputs
from transformer.decoding.step import (
    Hypothesis,
    Models,
    Stepper,
    evaluating,
)
from transformer.model import Transformer

# (lprobs (n, V), the rows' indices in the batch (n,), tokens generated so far: an int, or a (1,)
# tensor on the device in a static step) -> (n,) ids; a batch of B rows may hold padding rows,
# index B, whose tokens are ignored
TokenChoice = Callable[[Tensor, Tensor, int | Tensor], Tensor]


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
    target_prefix: Tensor | None = None,
) -> list[list[Hypothesis]]:
    """Translate ``src`` (B, S); return each sentence's one hypothesis.

    ``model``: one model, or a list of them decoded as an ensemble (their mean probabilities).
    From ``options``: the length rules, ``no_repeat_ngram_size`` and ``len_penalty`` (of the
    score only). A finished sentence leaves the batch (its cache rows too). ``max_lengths`` (B,)
    sets each sentence's maximum instead of ``max_len_a`` and ``max_len_b``. ``target_prefix``
    (B, P): each translation's given start (:mod:`transformer.decoding.prefix`). Runs in eval
    mode, restoring the mode the model was in.
    """
    rows = decode_rows(
        model, src, options, _likeliest, bos_id=bos_id, eos_id=eos_id, src_pad_mask=src_pad_mask,
        max_lengths=max_lengths, use_cache=use_cache, target_prefix=target_prefix,
    )  # fmt: skip
    return [[h] for h in rows]


def _likeliest(lprobs: Tensor, rows: Tensor, t: int | Tensor) -> Tensor:
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
    target_prefix: Tensor | None = None,
) -> list[Hypothesis]:
    """One hypothesis per row of ``src`` (B, S), its tokens chosen one a step by ``choose`` from
    the step's log-probabilities (banned ids at -inf), after the ``target_prefix`` (B, P) forced;
    score: their log-probability, eos included, / length ** ``options.len_penalty``."""
    models, src_pad_mask, max_len = search_inputs(model, src, options, src_pad_mask, max_lengths)
    hooks = search_hooks(models, src, options, bos_id, eos_id, target_prefix)
    max_len = hooks.lengthen(max_len, min(m.cfg.max_positions for m in models) - 1)
    with evaluating(*models):
        if use_static_search(options, src.device, use_cache):
            ids = (bos_id, eos_id, models[0].cfg.pad_id)
            out, total = static.decode_rows(
                models, src, src_pad_mask, max_len, hooks, options, choose, ids
            )
        else:
            out, total = _decode_rows(
                models, src, src_pad_mask, max_len, hooks, options, choose, bos_id, eos_id,
                use_cache,
            )  # fmt: skip
    hyps = []
    for row, score in zip(out.tolist(), total.tolist(), strict=True):
        length = row.index(eos_id)
        hyps.append(Hypothesis(row[:length], score / (length + 1) ** options.len_penalty))
    return hyps


def _decode_rows(
    models: list[Transformer],
    src: Tensor,
    src_pad_mask: Tensor,
    max_len: Tensor,
    hooks: SearchHook,
    options: DecodeOptions,
    choose: TokenChoice,
    bos_id: int,
    eos_id: int,
    use_cache: bool,
) -> tuple[Tensor, Tensor]:
    """The loop whose finished rows leave the batch -> each row's tokens (B, T), eos then
    padding after, and their log-probabilities (B,)."""
    pad_id = models[0].cfg.pad_id
    B, steps = src.size(0), int(max_len.max()) + 1
    every, device = sync_interval(options, src), src.device
    out = torch.full((B + 1, steps), pad_id, device=device)  # row B: padding rows' tokens
    total = torch.zeros(B + 1, device=device)  # (B + 1,) log-probability so far
    stepper = Stepper(models, src, src_pad_mask, use_cache, steps, use_graphs(options, device))
    sentence = torch.arange(B, device=device)  # (n,) the unfinished ones' rows in `out`
    prefixes = torch.full((B, 1), bos_id, device=device)  # (n, t + 1)
    ended = torch.zeros(B, dtype=torch.bool, device=device)  # (n,) past eos (sync_every > 1)
    for t in range(steps):  # t tokens generated so far
        lprobs = stepper.log_probs(prefixes)  # (n, V)
        hooks.observe(lprobs, sentence, 1, t)
        lprobs = hooks.log_probs(lprobs, prefixes, t)  # bans; a prefix's token alone
        token = choose(lprobs, sentence, t).masked_fill(t >= max_len, eos_id)  # (n,)
        gain = lprobs.gather(1, token.unsqueeze(1)).squeeze(1)  # (n,)
        if every > 1:  # a row past its eos waits for the next read, adding nothing
            token, gain = token.masked_fill(ended, pad_id), gain.masked_fill(ended, 0.0)
        out[sentence, t] = token
        total[sentence] += gain
        prefixes = torch.cat([prefixes, token.unsqueeze(1)], dim=1)
        ended = ended | token.eq(eos_id) if every > 1 else token.eq(eos_id)
        n = token.size(0)
        n_done, size = count_done(ended, t, steps, every)  # read every `every` steps
        if n_done == n:
            break
        if size != n:  # finished rows leave the batch, the others fill one of `size` rows
            n_live = n - n_done
            keep = live_rows(ended, n_live, size)  # (size,) padding rows: copies of the first
            stepper.reorder(keep)
            hooks.keep(keep)
            sentence, prefixes, max_len = sentence[keep], prefixes[keep], max_len[keep]
            ended = ended[keep]
            if size > n_live:  # past eos from the start, their tokens in row B
                sentence[n_live:], ended[n_live:] = B, True
    return out[:B, : t + 1], total[:B]
