"""Validation BLEU: the first ``validation.bleu_sentences`` sentences of each validation loader
(one a translation direction) decoded with ``validation.decoding``, gathered from every rank and
scored against the references (sacreBLEU's metrics, :data:`transformer.metrics.METRICS`, BLEU
with the ``metrics.tokenize`` tokenizer)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from transformer.data.collate import Batch
from transformer.data.tokenizer import Tokenizer
from transformer.decoding import DecodeOptions
from transformer.metrics import METRICS, TOKENIZE, TranslationScores, score_translations
from transformer.model import Transformer
from transformer.translate import decode_batch

if TYPE_CHECKING:
    from transformer.data.datamodule import TranslationDataModule


def translate_batch(
    model: Transformer,
    tokenizer: Tokenizer,
    batch: Batch,
    decoding: DecodeOptions,
    sentences: int | None,
) -> dict[int, str]:
    """The best translation of each sentence of ``batch`` among the first ``sentences`` of its
    loader (None: all), by sentence index."""
    keep = torch.ones_like(batch.ids, dtype=torch.bool)
    if sentences is not None:
        keep = batch.ids < sentences
    if not bool(keep.any()):
        return {}
    translations = decode_batch(
        model, tokenizer, batch.src[keep], decoding, batch.src_pad_mask[keep]
    )
    return {
        i: best[0].text if best else ""
        for i, best in zip(batch.ids[keep].tolist(), translations, strict=True)
    }


def score_directions(
    datamodule: TranslationDataModule,
    hyps: dict[int, dict[int, str]],
    world_size: int,
    tokenize: str = TOKENIZE,
) -> dict[str, TranslationScores]:
    """The scores of each direction (in the data's order) that has translations; ``hyps``: this
    rank's, by validation loader; ``tokenize``: BLEU's tokenizer. Every rank decoded its own
    shard: all of them take part."""
    scores = {}
    for idx, direction in enumerate(datamodule.directions):
        direction_hyps = hyps.get(idx, {})
        if world_size > 1:  # every rank decoded its own shard: gather them all
            parts: list[dict[int, str]] = [{} for _ in range(world_size)]
            torch.distributed.all_gather_object(parts, direction_hyps)
            direction_hyps = {k: v for part in parts for k, v in part.items()}
        if not direction_hyps:
            continue
        refs = datamodule.references("val", direction)
        ids = sorted(direction_hyps)
        scores[direction] = score_translations(
            [direction_hyps[i] for i in ids], [refs[i] for i in ids], tokenize
        )
    return scores


def bleu_metrics(
    scores: dict[str, TranslationScores], directions: Sequence[str]
) -> dict[str, float]:
    """The metrics logged of :func:`score_directions`: one direction's as ``val/bleu``,
    ``val/bleu_lc``, ``val/chrf``, ``val/chrf_pp`` and ``val/ter``; several as
    ``val/bleu/en-de`` ..., and ``val/bleu`` their mean."""
    metrics = {}
    for direction, score in scores.items():
        key = "" if len(directions) == 1 else f"/{direction}"
        for name in METRICS:
            metrics[f"val/{name}{key}"] = getattr(score, name)
    if len(directions) > 1 and scores:
        bleus = [score.bleu for score in scores.values()]
        metrics["val/bleu"] = sum(bleus) / len(bleus)
    return metrics


def signature_summary(scores: dict[str, TranslationScores]) -> dict[str, str]:
    """sacreBLEU's signature of each metric of :func:`score_directions`, as wandb's run summary
    records them: ``val/signature/bleu`` ... (the same for every direction: one set)."""
    first = next(iter(scores.values()), None)
    if first is None:
        return {}
    return {f"val/signature/{name}": first.signatures[name] for name in METRICS}
