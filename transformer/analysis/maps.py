"""Per-sentence attention maps of every layer and head, teacher-forced on given targets.

Capture runs the explicit attention path only here, on the probe batch; every other forward pass
keeps the fused kernel (``attention=None``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from transformer.data.collate import encode_sources, encode_targets, pad
from transformer.data.tokenizer import BOS_ID, EOS_ID, Tokenizer
from transformer.decoding import DecodeOptions, greedy_decode
from transformer.decoding.step import evaluating
from transformer.model import ATTENTION_TYPES, AttentionMaps, Transformer


@dataclass
class SentenceMaps:
    """One sentence's weights per attention type, each (L, H, Tq, Tk), trimmed of padding.

    Queries of the decoder are ``tgt_in`` (bos + target); keys of encoder self- and
    cross-attention are ``src`` (source + eos).
    """

    src: list[int]
    tgt_in: list[int]
    weights: dict[str, Tensor]

    def axes(self, kind: str) -> tuple[list[int], list[int]]:
        """(query ids, key ids) of an attention type."""
        if kind == "encoder_self":
            return self.src, self.src
        if kind == "decoder_self":
            return self.tgt_in, self.tgt_in
        return self.tgt_in, self.src


def stack_layers(weights: list[Tensor]) -> Tensor:
    """Each layer's (B, H_l, Tq, Tk) weights -> (B, L, H, Tq, Tk), H the most heads of any
    layer: the heads a pruned layer lacks (``python -m transformer.prune``) are all-zero maps,
    as a removed head attends nowhere."""
    heads = max(w.size(1) for w in weights)
    return torch.stack([F.pad(w, (0, 0, 0, 0, 0, heads - w.size(1))) for w in weights], 1)


@torch.no_grad()
def capture(
    model: Transformer, srcs: Sequence[list[int]], tgt_ins: Sequence[list[int]]
) -> list[SentenceMaps]:
    """Teacher-forced weights for each (source + eos, bos + target) pair, in one batch."""
    device = next(model.parameters()).device
    src = pad(srcs, model.cfg.pad_id, device)  # (B, S)
    tgt = pad(tgt_ins, model.cfg.pad_id, device)  # (B, T)
    maps = AttentionMaps()
    with evaluating(model):
        model(src, tgt, attention=maps)
    stacked = {kind: stack_layers(getattr(maps, kind)).float().cpu() for kind in ATTENTION_TYPES}
    out = []
    for i, (s, t) in enumerate(zip(srcs, tgt_ins, strict=True)):
        S, T = len(s), len(t)
        weights = {
            "encoder_self": stacked["encoder_self"][i, :, :, :S, :S],  # (L, H, S, S)
            "decoder_self": stacked["decoder_self"][i, :, :, :T, :T],  # (L, H, T, T)
            "cross": stacked["cross"][i, :, :, :T, :S],  # (L, H, T, S)
        }
        out.append(SentenceMaps(list(s), list(t), weights))
    return out


def capture_in_batches(
    model: Transformer,
    srcs: Sequence[list[int]],
    tgt_ins: Sequence[list[int]],
    batch_size: int = 32,
) -> list[SentenceMaps]:
    out: list[SentenceMaps] = []
    for start in range(0, len(srcs), batch_size):
        end = start + batch_size
        out.extend(capture(model, srcs[start:end], tgt_ins[start:end]))
    return out


@dataclass
class Probes:
    """Probe sentences as ids: sources (+ eos), references (bos + ...) when known, and the
    model's greedy translations (bos + ...) with their texts."""

    sources: list[str]
    references: list[str] | None
    src_ids: list[list[int]]
    ref_ids: list[list[int]] | None
    hyp_ids: list[list[int]]
    hypotheses: list[str]

    def first(self, n: int) -> Probes:
        refs, ref_ids = self.references, self.ref_ids
        return Probes(
            self.sources[:n], None if refs is None else refs[:n], self.src_ids[:n],
            None if ref_ids is None else ref_ids[:n], self.hyp_ids[:n], self.hypotheses[:n],
        )  # fmt: skip


def capture_probes(model: Transformer, probes: Probes) -> dict[str, list[SentenceMaps]]:
    """Each probe's maps teacher-forced on its reference (when known) and on the model's
    translation: {"reference": [...], "hypothesis": [...]}, one per probe."""
    targets = {"reference": probes.ref_ids, "hypothesis": probes.hyp_ids}
    return {
        name: capture(model, probes.src_ids, ids)
        for name, ids in targets.items()
        if ids is not None
    }


@torch.no_grad()
def translate_probes(
    model: Transformer,
    src_tok: Tokenizer,
    tgt_tok: Tokenizer,
    sources: Sequence[str],
    references: Sequence[str] | None = None,
    options: DecodeOptions | None = None,
) -> Probes:
    """Tokenize the probes and translate them greedily, with the length rules of ``options``
    (validation's; default: :class:`DecodeOptions`')."""
    limit = model.cfg.max_positions
    src_ids = encode_sources(src_tok, sources, limit)
    ref_ids = None if references is None else encode_targets(tgt_tok, references, limit)
    device = next(model.parameters()).device
    src = pad(src_ids, model.cfg.pad_id, device)
    hyps = greedy_decode(model, src, options or DecodeOptions(), bos_id=BOS_ID, eos_id=EOS_ID)
    hyp_ids = [[BOS_ID, *best.tokens] for (best,) in hyps]
    hypotheses = [tgt_tok.decode(ids) for ids in hyp_ids]
    return Probes(
        list(sources), None if references is None else list(references),
        src_ids, ref_ids, hyp_ids, hypotheses,
    )  # fmt: skip
