"""Batched greedy decoding on the decoder's KV cache.

Length rules are beam search's: a sentence gets between ``min_len`` and
``max_len_a * src_len + max_len_b`` tokens before its eos (its own source length, without padding;
capped by the model's positions), eos being forced at the limit; bos and pad are never produced.
As in beam search, the one host synchronisation of a step reads how many sentences finished.
"""

from __future__ import annotations

import torch
from torch import Tensor

from transformer.decoding.options import DecodeOptions
from transformer.decoding.step import (
    Hypothesis,
    Stepper,
    ban_repeated_ngrams,
    evaluating,
    sentence_max_lengths,
)
from transformer.masks import padding_mask
from transformer.model import Transformer


@torch.no_grad()
def greedy_decode(
    model: Transformer,
    src: Tensor,
    options: DecodeOptions,
    *,
    bos_id: int,
    eos_id: int,
    src_pad_mask: Tensor | None = None,
    max_lengths: Tensor | None = None,
    use_cache: bool = True,
) -> list[list[Hypothesis]]:
    """Translate ``src`` (B, S); return each sentence's one hypothesis (score None).

    From ``options``: the length rules and ``no_repeat_ngram_size`` (the beam-only options are
    not read). A finished sentence leaves the batch (its cache rows too). ``max_lengths`` (B,)
    sets each sentence's maximum instead of ``max_len_a`` and ``max_len_b``. Runs in eval mode,
    restoring the mode the model was in.
    """
    pad_id, min_len = model.cfg.pad_id, options.min_len
    if src_pad_mask is None:
        src_pad_mask = padding_mask(src, pad_id)
    max_len = sentence_max_lengths(model, src_pad_mask, options, max_lengths)
    B, steps = src.size(0), int(max_len.max()) + 1
    out = torch.full((B, steps), pad_id, device=src.device)
    with evaluating(model):
        stepper = Stepper(model, src, src_pad_mask, use_cache)
        sentence = torch.arange(B, device=src.device)  # (n,) the unfinished ones' rows in `out`
        prefixes = torch.full((B, 1), bos_id, device=src.device)  # (n, t + 1)
        never = torch.tensor([pad_id, bos_id], device=src.device)  # ids never generated
        too_soon = torch.tensor([pad_id, bos_id, eos_id], device=src.device)  # before min_len
        for t in range(steps):  # t tokens generated so far
            lprobs = stepper.log_probs(prefixes)  # (n, V)
            lprobs.index_fill_(1, too_soon if t < min_len else never, float("-inf"))
            lprobs = ban_repeated_ngrams(lprobs, prefixes[:, 1:], options.no_repeat_ngram_size)
            token = lprobs.argmax(-1).masked_fill(t >= max_len, eos_id)  # (n,)
            out[sentence, t] = token
            prefixes = torch.cat([prefixes, token.unsqueeze(1)], dim=1)
            n, n_done = token.size(0), int(token.eq(eos_id).sum())  # the step's one sync
            if n_done == n:
                break
            if n_done:  # finished rows leave the batch
                keep = token.ne(eos_id).nonzero_static(size=n - n_done).squeeze(1)  # (n',)
                stepper.reorder(keep)
                sentence, prefixes, max_len = sentence[keep], prefixes[keep], max_len[keep]
    return [[Hypothesis(row[: row.index(eos_id)], None)] for row in out[:, : t + 1].tolist()]
