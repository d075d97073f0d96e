"""The files of ``evaluate.py analysis=heads``: ``heads.json``, ``heads.md``,
``heads_importance.png`` and ``heads_pruning.png`` (:mod:`transformer.analysis.heads` measures)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import torch

from transformer.analysis import plots
from transformer.analysis.heads import HeadScore, PruningPoint, ranking
from transformer.analysis.ranks import spearman
from transformer.model import ATTENTION_TYPES


def _fmt(value: float | None, spec: str) -> str:
    return "" if value is None else format(value, spec)


def write_report(
    out_dir: Path,
    baseline: tuple[float, float],
    scores: list[HeadScore],
    points: list[PruningPoint],
    num_sentences: int,
) -> dict:
    """heads.json, heads.md (tables), heads_importance.png (layer x head per type: change in loss
    and BLEU when masked, gradient proxy; whichever were measured), heads_pruning.png (BLEU
    against share of heads left). With both measures, their Spearman rank correlation."""
    out_dir.mkdir(parents=True, exist_ok=True)
    by_mask, by_gradient = scores[0].delta_loss is not None, scores[0].gradient is not None
    rho = None
    if by_mask and by_gradient:
        rho = spearman(*(torch.tensor([getattr(s, m) for s in scores], dtype=torch.float64)
                         for m in ("delta_loss", "gradient")))  # fmt: skip
    result = {
        "num_sentences": num_sentences,
        "baseline": {"loss": baseline[0], "bleu": baseline[1]},
        "importance": "both" if by_mask and by_gradient else "mask" if by_mask else "gradient",
        "spearman_mask_gradient": rho,
        "heads": [asdict(s) for s in scores],
        "pruning": [asdict(p) for p in points],
    }
    (out_dir / "heads.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    lines = [
        f"Head importance on {num_sentences} sentences: baseline loss {baseline[0]:.4f}, "
        f"BLEU {baseline[1]:.2f}.",
    ]
    if rho is not None:
        lines += ["", f"Spearman rank correlation of loss increase when masked and gradient "
                      f"importance: {rho:+.3f} over {len(scores)} heads."]  # fmt: skip
    lines += [
        "",
        "| type | layer | head | Δ loss | Δ BLEU | gradient |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    rank = {key: i for i, key in enumerate(reversed(ranking(scores)))}  # most important first
    lines += [
        f"| {s.kind} | {s.layer} | {s.head} | {_fmt(s.delta_loss, '+.4f')} | "
        f"{_fmt(s.delta_bleu, '+.2f')} | {_fmt(s.gradient, '.4g')} |"
        for s in sorted(scores, key=lambda s: rank[(s.kind, s.layer, s.head)])
    ]
    lines += ["", "| heads left | share | loss | BLEU |", "|---:|---:|---:|---:|"]
    lines += [
        f"| {p.heads_left} | {p.share_left:.2f} | {p.loss:.4f} | {p.bleu:.2f} |" for p in points
    ]
    (out_dir / "heads.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    metrics = {"delta_loss": "loss increase", "delta_bleu": "BLEU drop", "gradient": "gradient"}
    panels = {}
    for metric, label in metrics.items():
        if getattr(scores[0], metric) is None:
            continue
        for kind in ATTENTION_TYPES:
            mine = [s for s in scores if s.kind == kind]
            grid = torch.zeros(max(s.layer for s in mine) + 1, max(s.head for s in mine) + 1)
            for s in mine:
                grid[s.layer, s.head] = getattr(s, metric)
            panels[f"{kind}: {label}"] = -grid if metric == "delta_bleu" else grid
    title = f"Head importance ({result['importance']}, {num_sentences} sentences)"
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
