"""Batched greedy decoding on the decoder's KV cache.

Length rules are beam search's: a sentence gets between ``min_len`` and
``max_len_a * src_len + max_len_b`` tokens before its eos (its own source length, without padding;
capped by the model's positions), eos being forced at the limit; bos and pad are never produced.
As in beam search, the one host synchronisation of a step reads how many sentences finished.
"""

from __future__ import annotations

import torch
from torch import Tensor

from transformer.decoding.step import Stepper, evaluating
from transformer.masks import padding_mask
from transformer.model import Transformer


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
    model: Transformer,
    src_pad_mask: Tensor,
    max_len_a: float,
    max_len_b: int,
    min_len: int,
    max_lengths: Tensor | None,
) -> Tensor:
    """(B,) most tokens before eos for each source row, within the model's positions (the
    decoder reads bos and every token but eos): :func:`max_output_lengths` of the rows."""
    return max_output_lengths(
        (~src_pad_mask).sum(1), max_len_a, max_len_b, min_len, model.cfg.max_positions - 1,
        max_lengths,
    )  # fmt: skip


@torch.no_grad()
def greedy_decode(
    model: Transformer,
    src: Tensor,
    bos_id: int,
    eos_id: int,
    src_pad_mask: Tensor | None = None,
    max_len_a: float = 1.2,
    max_len_b: int = 10,
    min_len: int = 1,
    max_lengths: Tensor | None = None,
) -> Tensor:
    """Source ids (B, S) -> output ids (B, T) without bos: each row ends with eos and is padded
    with ``pad_id`` after it. A finished sentence leaves the batch (its cache rows too).
    ``max_lengths`` (B,) sets each sentence's maximum instead of ``max_len_a`` and ``max_len_b``.
    Runs in eval mode, restoring the mode the model was in."""
    pad_id = model.cfg.pad_id
    if src_pad_mask is None:
        src_pad_mask = padding_mask(src, pad_id)
    max_len = sentence_max_lengths(model, src_pad_mask, max_len_a, max_len_b, min_len, max_lengths)
    B, steps = src.size(0), int(max_len.max()) + 1
    out = torch.full((B, steps), pad_id, device=src.device)
    with evaluating(model):
        stepper = Stepper(model, src, src_pad_mask)
        sentence = torch.arange(B, device=src.device)  # (n,) the unfinished ones' rows in `out`
        prefixes = torch.full((B, 1), bos_id, device=src.device)  # (n, t + 1)
        never = torch.tensor([pad_id, bos_id], device=src.device)  # ids never generated
        too_soon = torch.tensor([pad_id, bos_id, eos_id], device=src.device)  # before min_len
        for t in range(steps):  # t tokens generated so far
            lprobs = stepper.log_probs(prefixes)  # (n, V)
            lprobs.index_fill_(1, too_soon if t < min_len else never, float("-inf"))
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
    return out[:, : t + 1]
