"""evaluate's scores against a reference file, ``reference=FILE`` (one translation a line, line
for line): of ``hypotheses=FILE``, translations made elsewhere (no model), or of ``input=FILE``'s
translations once evaluate has made them. Line counts are compared before any translation (after
it, for ``input=-``); a difference is an error naming both files and their counts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from transformer.atomic import atomic_write_text
from transformer.data.text_files import line_count, read_lines
from transformer.decoding import DecodeOptions
from transformer.errors import ConfigError, DataError
from transformer.metrics import score_translations


def check_references(cfg: DictConfig, options: DecodeOptions, analysis: str | None) -> None:
    """Before any work: ``hypotheses=`` and ``reference=`` name files, in a mode that scores
    them: ``hypotheses=FILE reference=FILE`` alone, or ``input=FILE`` (or ``-``) translated by
    ``ckpt_path`` one line a line, and ``input=FILE``'s line count is the reference's."""
    hypotheses, reference = cfg.get("hypotheses"), cfg.get("reference")
    if hypotheses is None and reference is None:
        return
    if hypotheses is not None:
        if reference is None:
            raise ConfigError(
                f"hypotheses={hypotheses} is scored against reference=FILE; give the reference "
                "translations, one a line"
            )
        for given, name in (
            (not OmegaConf.is_missing(cfg, "ckpt_path"), "ckpt_path"),
            (cfg.input is not None, "input"),
            (cfg.score, "score=true"),
            (analysis is not None, "analysis"),
            (cfg.prefixes is not None, "prefixes"),
            (cfg.get("constraints") is not None, "constraints"),
        ):
            if given:
                raise ConfigError(
                    f"hypotheses={hypotheses} scores translations made elsewhere, without a "
                    f"model; leave out {name} (to translate and score, give input=FILE "
                    f"reference=FILE ckpt_path=CKPT)"
                )
    else:
        _check_translated(cfg, options, analysis, str(reference))
    for name in ("hypotheses", "reference"):
        path = cfg.get(name)
        if path is not None and not Path(str(path)).is_file():
            raise ConfigError(f"{name}={path}: no such file (one translation a line)")
    if cfg.input not in (None, "-"):  # (the translations of input=- are counted once made)
        lines, references = (line_count(str(p), read_through=True) for p in (cfg.input, reference))
        _same_count(f"input={cfg.input}", lines, str(reference), references)


def _check_translated(
    cfg: DictConfig, options: DecodeOptions, analysis: str | None, reference: str
) -> None:
    """``reference=`` beside what evaluate translates: input=FILE's lines, one translation each."""
    if cfg.input is None:
        raise ConfigError(
            f"reference={reference} scores input=FILE's translations, or hypotheses=FILE; a "
            "split is scored against its own references: leave reference= out"
        )
    if OmegaConf.is_missing(cfg, "ckpt_path"):
        raise ConfigError(
            f"input={cfg.input} reference={reference} translates input= with the model "
            f"ckpt_path=CKPT, then scores it; give ckpt_path, or to score a file of "
            f"translations give it as hypotheses={cfg.input}"
        )
    for wrong, name in (
        (cfg.score, "score=true"),
        (analysis is not None, f"analysis={analysis}"),
        (options.nbest > 1, f"decode.nbest={options.nbest}"),
        (options.print_scores, "decode.print_scores=true"),
        (options.alignment, "decode.alignment=true"),
    ):
        if wrong:
            raise ConfigError(
                f"reference={reference} scores one translation a line, input=FILE's; leave out "
                f"{name} (or reference=)"
            )


def _same_count(origin: str, lines: int | None, reference: str, references: int | None,
                where: str = "") -> None:  # fmt: skip
    """A :class:`DataError` naming both files and their counts where ``origin`` has another
    number of lines than ``reference`` (``where``: the translations' file, when made)."""
    if lines != references:
        raise DataError(
            f"{origin} has {lines} lines but reference={reference} has {references}: give one "
            f"reference a line, line for line{where}"
        )


def score_hypotheses(cfg: DictConfig, out_dir: Path) -> dict[str, Any]:
    """hypotheses=FILE against reference=FILE: sacreBLEU's scores (metrics.json)."""
    hypotheses, references = read_lines(str(cfg.hypotheses)), read_lines(str(cfg.reference))
    origin = f"hypotheses={cfg.hypotheses}"
    _same_count(origin, len(hypotheses), cfg.reference, len(references))
    record = {"hypotheses": str(cfg.hypotheses), "reference": str(cfg.reference)}
    return _write_scores(cfg, hypotheses, references, record, out_dir)


def score_translated(cfg: DictConfig, translated: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    """input='s translations, in ``translated["output"]`` (:func:`translate_file`'s result),
    against reference=FILE: sacreBLEU's scores with ``translated`` (metrics.json)."""
    hypotheses, references = read_lines(translated["output"]), read_lines(str(cfg.reference))
    where = f" (the translations are in {translated['output']})"
    _same_count(f"input={cfg.input}", len(hypotheses), cfg.reference, len(references), where)
    record = {"input": str(cfg.input), "reference": str(cfg.reference), **translated}
    return _write_scores(cfg, hypotheses, references, record, out_dir)


def _write_scores(
    cfg: DictConfig,
    hypotheses: list[str],
    references: list[str],
    record: dict[str, Any],
    out_dir: Path,
) -> dict[str, Any]:
    scores = score_translations(hypotheses, references, cfg.metrics.tokenize)
    metrics = {**scores.to_dict(), **record}
    atomic_write_text(out_dir / "metrics.json", json.dumps(metrics, indent=2) + "\n")
    return metrics
