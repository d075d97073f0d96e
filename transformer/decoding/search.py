"""What the searches (greedy, beam, sampling) share around their loops: the inputs they start
from, their hooks (:mod:`transformer.decoding.hooks`), the ids each step bans, and how the rows of
finished sentences leave the batch."""

from __future__ import annotations

import torch
from torch import Tensor

from transformer.decoding.constraints import Constraints, Phrases
from transformer.decoding.hooks import Hooks, SearchHook
from transformer.decoding.options import DecodeOptions
from transformer.decoding.prefix import ForcedPrefix
from transformer.decoding.runtime import batch_size
from transformer.decoding.step import (
    Models,
    as_ensemble,
    ban_repeated_ngrams,
    ban_repeated_ngrams_at,
    sentence_max_lengths,
)
from transformer.masks import padding_mask
from transformer.model import Transformer


def search_inputs(
    model: Models,
    src: Tensor,
    options: DecodeOptions,
    src_pad_mask: Tensor | None,
    max_lengths: Tensor | None,
) -> tuple[list[Transformer], Tensor, Tensor]:
    """What every search starts from: the models (:func:`as_ensemble`), the source's padding
    mask (B, S) (from its pad ids unless given) and each sentence's most tokens before eos (B,)
    (:func:`sentence_max_lengths`)."""
    models = as_ensemble(model)
    if src_pad_mask is None:
        src_pad_mask = padding_mask(src, models[0].cfg.pad_id)
    return models, src_pad_mask, sentence_max_lengths(models, src_pad_mask, options, max_lengths)


def search_hooks(
    models: list[Transformer],
    src: Tensor,
    options: DecodeOptions,
    bos_id: int,
    eos_id: int,
    target_prefix: Tensor | None = None,
    constraints: Phrases | None = None,
) -> Hooks:
    """A search's features as hooks, in the order each moment calls them: the banned ids, the
    ``constraints`` (beam search), the ``target_prefix`` (B, P) forced (its token after the bans,
    whatever they ban). Those not asked for are left out."""
    pad_id, vocab_size = models[0].cfg.pad_id, models[0].cfg.tgt_vocab_size
    special = (pad_id, bos_id, eos_id)
    return Hooks(
        TokenBans(options, pad_id, bos_id, eos_id, src.device),
        Constraints.of(constraints, src.size(0), vocab_size, special, src.device),
        ForcedPrefix.of(target_prefix, pad_id, bos_id, eos_id, options.score_prefix),
    )


class TokenBans(SearchHook):
    """The ids a step may not produce: pad and bos ever, eos before ``min_len`` tokens, and any
    that would repeat an n-gram of ``no_repeat_ngram_size`` (:func:`ban_repeated_ngrams`). The
    ids are index tensors made once, before the search's loop: nothing is copied in it."""

    def __init__(
        self, options: DecodeOptions, pad_id: int, bos_id: int, eos_id: int, device: torch.device
    ) -> None:
        self.never = torch.tensor([pad_id, bos_id], device=device)  # ids never generated
        self.too_soon = torch.tensor([pad_id, bos_id, eos_id], device=device)  # before min_len
        self.min_len, self.ngram, self.eos_id = (
            options.min_len,
            options.no_repeat_ngram_size,
            eos_id,
        )

    def log_probs(self, lprobs: Tensor, prefixes: Tensor, t: int | Tensor) -> Tensor:
        """lprobs (N, V) of prefixes (N, t + 1), bos first, after t tokens generated -> (N, V),
        the banned ids at -inf (``lprobs`` is changed in place). A static step's ``t`` (1,):
        eos banned by a mask, the n-grams read from the prefixes' buffer."""
        if isinstance(t, Tensor):
            lprobs.index_fill_(1, self.never, float("-inf"))
            lprobs[:, self.eos_id].masked_fill_(t < self.min_len, float("-inf"))
            return ban_repeated_ngrams_at(lprobs, prefixes[:, 1:], t, self.ngram)
        lprobs.index_fill_(1, self.too_soon if t < self.min_len else self.never, float("-inf"))
        return ban_repeated_ngrams(lprobs, prefixes[:, 1:], self.ngram)


def count_done(done: Tensor, t: int, steps: int, every: int) -> tuple[int, int]:
    """After step ``t`` of at most ``steps``: how many of the rows are ``done`` (n,), and how
    many rows the others go on in (:func:`transformer.decoding.runtime.batch_size`). The host reads
    the count (the one synchronisation) every ``every`` steps, at the first and at the last;
    between reads, (0, n): the batch keeps its rows."""
    n = done.size(0)
    if not (every == 1 or t in (0, steps - 1) or (t + 1) % every == 0):
        return 0, n
    n_done = int(done.sum())  # the host synchronisation
    return n_done, batch_size(n - n_done, every)


def live_rows(done: Tensor, n_live: int, size: int) -> Tensor:
    """(size,) the indices of the ``n_live`` rows not ``done`` (n,), then copies of the first
    (padding rows) up to ``size``: index tensors of sizes known on the host, no boolean masks."""
    keep = (~done).nonzero_static(size=n_live).squeeze(1)  # (n_live,)
    if size > n_live:  # padding rows, copies of the first
        keep = torch.cat([keep, keep[:1].expand(size - n_live)])  # (size,)
    return keep
