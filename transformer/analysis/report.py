"""Files of one analysis pass: attention-map PNGs of the probes, head statistics (PNG, JSON,
scalars), head roles (Markdown, JSON) and sample translations (Markdown, JSON). Shared by the
training callback and ``evaluate.py analysis=maps``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import sacrebleu
from torch import Tensor

from transformer.analysis import plots
from transformer.analysis.maps import Probes, SentenceMaps, capture_in_batches
from transformer.analysis.roles import ALIGNMENT, BOUNDARY, BROAD, POSITIONAL, head_roles
from transformer.analysis.stats import STATS, head_stats
from transformer.data.tokenizer import Tokenizer
from transformer.model import Transformer

Images = dict[str, list[tuple[Path, str]]]  # logger key -> (PNG path, caption) per probe


@dataclass
class MapFigure:
    """What one head-grid PNG shows: a layer's heads of one attention type for one probe and
    target, cut to ``max_pieces`` on each axis; plain data, drawn by :func:`draw_maps` (in
    another process during training)."""

    path: Path
    key: str  # logger key: attn/<type>/layer<l>
    caption: str
    title: str
    weights: Tensor  # (H, q, k)
    query_pieces: list[str]
    key_pieces: list[str]


def map_figures(
    captured: dict[str, list[SentenceMaps]],
    src_tok: Tokenizer,
    tgt_tok: Tokenizer,
    out_dir: Path,
    types: Sequence[str],
    max_pieces: int = 40,
) -> list[MapFigure]:
    """One figure per (attention type, layer, probe, target) of the probes' maps (from
    :func:`~transformer.analysis.maps.capture_probes`), to be written as ``<out_dir>/<type>/
    layer<l>/probe<i>_<reference|hypothesis>.png``. Longer sentences are cut to their first
    ``max_pieces`` pieces on each axis."""
    figures = []
    for variant, sentences in captured.items():
        for i, sentence in enumerate(sentences):
            for kind in types:
                q_ids, k_ids = (ids[:max_pieces] for ids in sentence.axes(kind))
                q_side = src_tok if kind == "encoder_self" else tgt_tok
                k_side = tgt_tok if kind == "decoder_self" else src_tok
                weights = sentence.weights[kind][:, :, : len(q_ids), : len(k_ids)]  # (L, H, q, k)
                q_pieces, k_pieces = q_side.pieces(q_ids), k_side.pieces(k_ids)
                for layer in range(weights.size(0)):
                    figures.append(
                        MapFigure(
                            out_dir / kind / f"layer{layer}" / f"probe{i}_{variant}.png",
                            f"attn/{kind}/layer{layer}",
                            f"probe {i} ({variant})",
                            f"{kind} attention, layer {layer}: probe {i}, on the {variant}",
                            weights[layer].clone(),
                            q_pieces,
                            k_pieces,
                        )  # fmt: skip
                    )
    return figures


def draw_maps(figures: Sequence[MapFigure]) -> Images:
    """Write each figure's PNG (the heads of its layer in a grid). The figures of one logger key
    (its probes and targets) share a size, the largest of theirs: wandb lays out a key's images at
    the first one's size (and warns when they differ)."""
    canvas: dict[str, tuple[float, float]] = {}
    for f in figures:
        width, height = plots.grid_inches(len(f.weights), f.query_pieces, f.key_pieces)
        widest, tallest = canvas.get(f.key, (0.0, 0.0))
        canvas[f.key] = (max(width, widest), max(height, tallest))
    images: Images = {}
    for f in figures:
        fig = plots.head_grid(
            f.weights, f.query_pieces, f.key_pieces, f.title, canvas=canvas[f.key]
        )
        images.setdefault(f.key, []).append((plots.save(fig, f.path), f.caption))
    return images


def write_stats(
    model: Transformer, src_ids: list[list[int]], ref_ids: list[list[int]], out_dir: Path,
    types: Sequence[str], draw: bool = True,
) -> tuple[dict[str, dict[str, Tensor]], Images]:  # fmt: skip
    """Head statistics teacher-forced on the references: ``stats.json``, the heads' roles and,
    if ``draw``, one layer x head heatmap per attention type (:func:`draw_stats`). Returns
    {type: {stat: (L, H)}}, images."""
    sentences = capture_in_batches(model, src_ids, ref_ids)
    stats = {kind: head_stats(sentences, kind) for kind in types}
    out_dir.mkdir(parents=True, exist_ok=True)
    as_lists = {k: {s: v.tolist() for s, v in values.items()} for k, values in stats.items()}
    (out_dir / "stats.json").write_text(json.dumps(as_lists, indent=1) + "\n", encoding="utf-8")
    write_roles(stats, out_dir)
    return stats, draw_stats(stats, len(sentences), out_dir) if draw else {}


def draw_stats(stats: dict[str, dict[str, Tensor]], num_sentences: int, out_dir: Path) -> Images:
    """One layer x head heatmap of the statistics per attention type: ``stats_<type>.png``."""
    images: Images = {}
    for kind, values in stats.items():
        title = f"{kind} attention heads over {num_sentences} sentences"
        path = plots.save(plots.layer_head_heatmaps(values, title), out_dir / f"stats_{kind}.png")
        images[f"attn_stats/{kind}"] = [(path, title)]
    return images


def write_roles(stats: dict[str, dict[str, Tensor]], out_dir: Path) -> dict[str, list[list[str]]]:
    """Each head's role (:mod:`transformer.analysis.roles`) beside its statistics: ``roles.md``
    (a table) and ``roles.json`` ({type: roles layer by layer})."""
    roles = head_roles(stats)
    lines = [
        "Head roles (transformer/analysis/roles.py): thresholds "
        f"boundary >= {BOUNDARY}, alignment (cross: agreement with the mean cross-attention's "
        f"argmax) >= {ALIGNMENT}, previous/same/next >= {POSITIONAL}, broad: entropy >= "
        f"{BROAD} nats.",
        "",
        "| type | layer | head | role | " + " | ".join(STATS) + " |",
        "|---|---:|---:|---|" + "---:|" * len(STATS),
    ]
    for kind, layers in roles.items():
        for layer, heads in enumerate(layers):
            for head, role in enumerate(heads):
                values = " | ".join(f"{float(stats[kind][n][layer, head]):.3f}" for n in STATS)
                lines.append(f"| {kind} | {layer} | {head} | {role} | {values} |")
    (out_dir / "roles.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (out_dir / "roles.json").write_text(json.dumps(roles, indent=1) + "\n", encoding="utf-8")
    return roles


def stat_scalars(stats: dict[str, dict[str, Tensor]]) -> dict[str, float]:
    """``attn_stats/<type>/<stat>/l<layer>h<head>`` -> value, for the loggers."""
    return {
        f"attn_stats/{kind}/{name}/l{layer}h{head}": float(values[name][layer, head])
        for kind, values in stats.items()
        for name in STATS
        for layer in range(values[name].size(0))
        for head in range(values[name].size(1))
    }


SAMPLE_COLUMNS = ["source", "reference", "hypothesis", "sentence_bleu"]


def write_samples(probes: Probes, out_dir: Path, count: int) -> list[list[str | float]]:
    """The first ``count`` probes with their translation and sentence BLEU: ``samples.md`` and
    ``samples.json``; returns the rows (``SAMPLE_COLUMNS``)."""
    references = probes.references or [""] * len(probes.sources)
    rows: list[list[str | float]] = []
    for src, ref, hyp in list(zip(probes.sources, references, probes.hypotheses, strict=True))[
        :count
    ]:
        bleu = round(sacrebleu.sentence_bleu(hyp, [ref]).score, 2) if ref else float("nan")
        rows.append([src, ref, hyp, bleu])
    out_dir.mkdir(parents=True, exist_ok=True)
    lines = ["| " + " | ".join(SAMPLE_COLUMNS) + " |", "|---|---|---|---:|"]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    (out_dir / "samples.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    records = [dict(zip(SAMPLE_COLUMNS, row, strict=True)) for row in rows]
    (out_dir / "samples.json").write_text(json.dumps(records, indent=1) + "\n", encoding="utf-8")
    return rows
