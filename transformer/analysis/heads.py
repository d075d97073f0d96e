"""Head importance by masking (Michel et al. 2019, "Are Sixteen Heads Really Better than One?").

Each head of each attention module is masked in turn (the rest kept) and the change in
teacher-forced loss and in greedy BLEU is measured on the given pairs. Heads are then pruned
greedily, least important (smallest loss increase) first, and BLEU is measured against the share
of heads left. Results: ``heads.json``, ``heads.md``, ``heads_importance.png``,
``heads_pruning.png``.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from transformer.analysis import plots
from transformer.data.collate import encode_sources, encode_targets, pad
from transformer.data.tokenizer import EOS_ID
from transformer.decoding import DecodeOptions
from transformer.decoding.step import evaluating
from transformer.metrics import score_translations
from transformer.model import ATTENTION_TYPES, Transformer
from transformer.translate import Translator

log = logging.getLogger(__name__)


@dataclass
class HeadScore:
    kind: str
    layer: int
    head: int
    loss: float  # mean NLL per target token with this head masked
    bleu: float
    delta_loss: float  # minus the unmasked model's
    delta_bleu: float


@dataclass
class PruningPoint:
    heads_left: int
    share_left: float
    loss: float
    bleu: float


class HeadEvaluator:
    """Loss and BLEU of ``translator.model`` on fixed (source, reference) pairs, under whatever
    head masks are set on the model."""

    def __init__(
        self,
        translator: Translator,
        sources: list[str],
        references: list[str],
        options: DecodeOptions,
        batch_size: int = 64,
    ) -> None:
        self.translator, self.options = translator, options
        self.model: Transformer = translator.model
        self.sources, self.references = sources, references
        limit = self.model.cfg.max_positions
        src_ids = encode_sources(translator.src_tokenizer, sources, limit)
        tgt_in = encode_targets(translator.tgt_tokenizer, references, limit)
        labels = [[*ids[1:], EOS_ID] for ids in tgt_in]  # y + eos
        device, pad_id = translator.device, self.model.cfg.pad_id
        self.batches = [
            tuple(
                pad(seqs[i : i + batch_size], pad_id, device) for seqs in (src_ids, tgt_in, labels)
            )
            for i in range(0, len(src_ids), batch_size)
        ]

    @torch.no_grad()
    def loss(self) -> float:
        total, count = 0.0, 0
        pad_id = self.model.cfg.pad_id
        with evaluating(self.model):
            for src, tgt_in, labels in self.batches:
                logits = self.model(src, tgt_in)  # (B, T, V)
                nll = F.cross_entropy(
                    logits.float().transpose(1, 2), labels, ignore_index=pad_id, reduction="sum"
                )
                total, count = total + float(nll), count + int(labels.ne(pad_id).sum())
        return total / max(count, 1)

    def bleu(self) -> float:
        hyps = [t[0].text for t in self.translator.translate(self.sources, self.options)]
        return score_translations(hyps, self.references).bleu

    def score(self) -> tuple[float, float]:
        return self.loss(), self.bleu()


def all_heads(model: Transformer) -> list[tuple[str, int, int]]:
    return [
        (kind, layer, head)
        for kind in ATTENTION_TYPES
        for layer, module in enumerate(model.attention_modules(kind))
        for head in range(module.num_heads)
    ]


def set_pruned(model: Transformer, pruned: list[tuple[str, int, int]]) -> None:
    """Mask exactly the ``pruned`` heads (all others on)."""
    model.clear_head_masks()
    masks: dict[tuple[str, int], torch.Tensor] = {}
    for kind, layer, head in pruned:
        key = (kind, layer)
        if key not in masks:
            masks[key] = torch.ones(model.attention_modules(kind)[layer].num_heads)
        masks[key][head] = 0.0
    for (kind, layer), mask in masks.items():
        model.set_head_mask(kind, layer, mask)


def head_importance(evaluator: HeadEvaluator) -> tuple[tuple[float, float], list[HeadScore]]:
    """(baseline loss, BLEU) and each head's score when masked alone."""
    model = evaluator.model
    model.clear_head_masks()
    base_loss, base_bleu = evaluator.score()
    scores = []
    for kind, layer, head in all_heads(model):
        set_pruned(model, [(kind, layer, head)])
        loss, bleu = evaluator.score()
        scores.append(HeadScore(kind, layer, head, loss, bleu, loss - base_loss, bleu - base_bleu))
        log.info("masked %s layer %d head %d: loss %+.4f, BLEU %+.2f", kind, layer, head,
                 loss - base_loss, bleu - base_bleu)  # fmt: skip
    model.clear_head_masks()
    return (base_loss, base_bleu), scores


def prune_greedily(
    evaluator: HeadEvaluator, scores: list[HeadScore], step: float = 0.1
) -> list[PruningPoint]:
    """Mask the least important heads first (by loss increase), a share ``step`` of all heads
    more at each point, down to one head; loss and BLEU at each point."""
    order = [(s.kind, s.layer, s.head) for s in sorted(scores, key=lambda s: s.delta_loss)]
    total = len(order)
    counts = sorted({min(round(i * step * total), total - 1) for i in range(int(1 / step) + 1)})
    points = []
    for pruned in counts:
        set_pruned(evaluator.model, order[:pruned])
        loss, bleu = evaluator.score()
        left = total - pruned
        points.append(PruningPoint(left, left / total, loss, bleu))
    evaluator.model.clear_head_masks()
    return points


def write_report(
    out_dir: Path,
    baseline: tuple[float, float],
    scores: list[HeadScore],
    points: list[PruningPoint],
    num_sentences: int,
) -> dict:
    """heads.json, heads.md (table), heads_importance.png (layer x head per type: change in loss
    and BLEU when masked), heads_pruning.png (BLEU against share of heads left)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    result = {
        "num_sentences": num_sentences,
        "baseline": {"loss": baseline[0], "bleu": baseline[1]},
        "heads": [asdict(s) for s in scores],
        "pruning": [asdict(p) for p in points],
    }
    (out_dir / "heads.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    lines = [
        f"Head importance on {num_sentences} sentences: baseline loss {baseline[0]:.4f}, "
        f"BLEU {baseline[1]:.2f}.",
        "",
        "| type | layer | head | Δ loss | Δ BLEU |",
        "|---|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {s.kind} | {s.layer} | {s.head} | {s.delta_loss:+.4f} | {s.delta_bleu:+.2f} |"
        for s in sorted(scores, key=lambda s: -s.delta_loss)
    ]
    lines += ["", "| heads left | share | loss | BLEU |", "|---:|---:|---:|---:|"]
    lines += [
        f"| {p.heads_left} | {p.share_left:.2f} | {p.loss:.4f} | {p.bleu:.2f} |" for p in points
    ]
    (out_dir / "heads.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    panels = {}
    for metric in ("delta_loss", "delta_bleu"):
        for kind in ATTENTION_TYPES:
            mine = [s for s in scores if s.kind == kind]
            grid = torch.zeros(max(s.layer for s in mine) + 1, max(s.head for s in mine) + 1)
            for s in mine:
                grid[s.layer, s.head] = getattr(s, metric)
            if metric == "delta_loss":
                panels[f"{kind}: loss increase"] = grid
            else:
                panels[f"{kind}: BLEU drop"] = -grid
    title = f"Head importance: one head masked at a time ({num_sentences} sentences)"
    plots.save(
        plots.layer_head_heatmaps(panels, title, cmap="RdBu_r", center_zero=True),
        out_dir / "heads_importance.png",
    )
    plots.save(
        plots.line_plot(
            [p.share_left for p in points], [p.bleu for p in points], "share of heads left",
            "BLEU", f"Greedy head pruning ({num_sentences} sentences)",
        ),
        out_dir / "heads_pruning.png",
    )  # fmt: skip
    return result
