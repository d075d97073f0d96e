"""``evaluate.py analysis=heads|maps``: head importance and pruning, or attention maps, of a
checkpoint on (the first sentences of) a split."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from transformer.analysis import explorer
from transformer.analysis.heads import HeadEvaluator, head_importance, prune_greedily
from transformer.analysis.heads_report import write_report
from transformer.analysis.maps import capture_probes, translate_probes
from transformer.analysis.options import check_analysis, check_analysis_options, number
from transformer.analysis.report import draw_maps, map_figures, write_samples, write_stats
from transformer.data.collate import encode_sources, encode_targets
from transformer.decoding import DecodeOptions
from transformer.model import ATTENTION_TYPES
from transformer.translate import Translator

log = logging.getLogger(__name__)


def run_analysis(
    kind: str,
    translator: Translator,
    sources: list[str],
    references: list[str],
    options: DictConfig,
    out_dir: Path,
) -> dict[str, Any]:
    """Run one analysis of :data:`transformer.analysis.options.ANALYSES` on the first
    ``options.sentences`` pairs (null = all); its options checked first
    (:func:`transformer.analysis.options.check_analysis_options`)."""
    check_analysis(kind)
    check_analysis_options(kind, options)
    count = options.sentences
    if count is not None:
        count = number(options, "sentences", int)
        sources, references = sources[:count], references[:count]
    if kind == "heads":
        by, normalize = options.get("importance", "both"), options.get("normalize_by_layer", False)
        greedy = DecodeOptions(strategy="greedy")
        evaluator = HeadEvaluator(translator, sources, references, greedy)
        baseline, scores = head_importance(evaluator, by, normalize)
        points = prune_greedily(evaluator, scores, number(options, "prune_step", float))
        result = write_report(out_dir, baseline, scores, points, len(sources))
        log.info("head importance written to %s (heads.md, heads.json, heads_*.png)", out_dir)
        return {"analysis": "heads", "out_dir": str(out_dir), **result}
    model, src_tok, tgt_tok = translator.model, translator.src_tokenizer, translator.tgt_tokenizer
    n = number(options, "probes", int)
    probes = translate_probes(model, src_tok, tgt_tok, sources[:n], references[:n])
    captured = capture_probes(model, probes)
    draw_maps(map_figures(captured, src_tok, tgt_tok, out_dir / "attention", ATTENTION_TYPES))
    limit = model.cfg.max_positions
    stats, _ = write_stats(
        model, encode_sources(src_tok, sources, limit), encode_targets(tgt_tok, references, limit),
        out_dir / "attention", ATTENTION_TYPES,
    )  # fmt: skip
    write_samples(probes, out_dir / "attention", n)
    record = explorer.validation_record(
        None, probes, captured, stats, src_tok, tgt_tok, ATTENTION_TYPES
    )  # one record, of no training step
    explorer.write_page([record], out_dir / "attention" / "explorer.html")
    log.info("attention maps written to %s", out_dir / "attention")
    return {"analysis": "maps", "num_sentences": len(sources), "out_dir": str(out_dir)}
