"""Word alignments from cross-attention (fairseq's ``--print-alignment``): one teacher-forced pass
over the final translations, with attention weights, then the likeliest source word per target
word.

The row of target piece i is decoder input position i, whose query predicted that piece (its input
is the piece before it, bos first), as fairseq takes the attention of the step that produced it.
Source eos and padding are never aligned to. Pieces become words as in the attention explorer: a
source word's weight is the sum over its pieces, a target word's row the mean of its pieces' rows.
"""

from __future__ import annotations

import torch
from torch import Tensor

from transformer.decoding.step import Models, as_ensemble, evaluating
from transformer.errors import ConfigError
from transformer.model import AttentionMaps


@torch.no_grad()
def cross_attention(
    model: Models, src: Tensor, tgt_in: Tensor, layer: int = -1, head: int | None = None
) -> Tensor:
    """Source ids (B, S) and decoder inputs (B, T) -> (B, T, S): the cross-attention weights of
    decoder ``layer``, of ``head`` or averaged over its heads (and over an ensemble's models)."""
    maps = []
    for m in as_ensemble(model):
        layers, heads = m.cfg.num_decoder_layers, m.cfg.num_heads
        if not -layers <= layer < layers:
            raise ConfigError(
                f"decode.alignment_layer={layer}, but the model has {layers} decoder layers; "
                f"choose one of {-layers}..{layers - 1} (-1 = the last)"
            )
        if head is not None and head >= heads:
            raise ConfigError(
                f"decode.alignment_head={head}, but the model's layers have {heads} heads; choose "
                f"one of 0..{heads - 1}, or null for their mean"
            )
        attention = AttentionMaps()
        with evaluating(m):
            m(src, tgt_in, attention=attention)
        weights = attention.cross[layer].float()  # (B, H, T, S)
        maps.append(weights.mean(1) if head is None else weights[:, head])
    return torch.stack(maps).mean(0)  # (B, T, S)


def word_alignment(
    weights: Tensor, tgt_words: list[int], src_words: list[int]
) -> list[tuple[int, int]]:
    """Piece weights (T, S) of T target and S source pieces, and each piece's word -> (source
    word, target word) pairs, one per target word, in target order."""
    if not tgt_words or not src_words:
        return []
    to_src = torch.nn.functional.one_hot(torch.tensor(src_words)).to(weights)  # (S, Ws)
    to_tgt = torch.nn.functional.one_hot(torch.tensor(tgt_words)).to(weights)  # (T, Wt)
    by_word = to_tgt.T @ weights @ to_src / to_tgt.sum(0).unsqueeze(1)  # (Wt, Ws)
    return [(s, t) for t, s in enumerate(by_word.argmax(1).tolist())]


def format_alignment(pairs: list[tuple[int, int]]) -> str:
    """``"0-0 1-2 ..."``: source word - target word, as fairseq prints them."""
    return " ".join(f"{s}-{t}" for s, t in pairs)
