"""Batched greedy decoding on the decoder's KV cache.

The source is encoded once, every layer's cross-attention keys/values are cached once, and each
step feeds only the last token to ``Transformer.decode(..., cache=cache)``. A sentence stops at its
first eos or after ``max_len_a * src_len + max_len_b`` tokens (its own source length, without
padding); the loop ends when every sentence has stopped.
"""

from __future__ import annotations

import torch
from torch import Tensor

from transformer.masks import padding_mask
from transformer.model import Transformer


def max_output_lengths(src_lens: Tensor, max_len_a: float, max_len_b: int, cap: int) -> Tensor:
    """(B,) longest output per sentence, ``a * src_len + b``, at least 1 and at most ``cap``."""
    lengths = (src_lens.float() * max_len_a).floor().long() + max_len_b
    return lengths.clamp(min=1, max=cap)


@torch.no_grad()
def greedy_decode(
    model: Transformer,
    src: Tensor,
    bos_id: int,
    eos_id: int,
    src_pad_mask: Tensor | None = None,
    max_len_a: float = 1.2,
    max_len_b: int = 10,
) -> Tensor:
    """Source ids (B, S) -> output ids (B, T) without bos: each row ends with eos unless it hit its
    length limit, and is padded with ``pad_id`` after that. Runs in eval mode, restoring the mode
    the model was in."""
    pad_id = model.cfg.pad_id
    if src_pad_mask is None:
        src_pad_mask = padding_mask(src, pad_id)
    was_training = model.training
    model.eval()
    try:
        batch = src.size(0)
        limits = max_output_lengths(
            (~src_pad_mask).sum(1), max_len_a, max_len_b, model.cfg.max_positions - 1
        )
        memory = model.encode(src, src_pad_mask)
        cache = model.init_cache(memory, src_pad_mask)
        last = torch.full((batch, 1), bos_id, dtype=torch.long, device=src.device)
        finished = torch.zeros(batch, dtype=torch.bool, device=src.device)
        out: list[Tensor] = []
        for step in range(int(limits.max())):
            logits = model.decode(last, cache=cache)[:, -1]  # (B, V)
            token = logits.argmax(-1)
            token = token.masked_fill(finished, pad_id)
            out.append(token)
            finished |= token.eq(eos_id) | (limits <= step + 1)
            if bool(finished.all()):
                break
            last = token.unsqueeze(1)
        return torch.stack(out, 1) if out else src.new_empty((batch, 0))
    finally:
        model.train(was_training)
