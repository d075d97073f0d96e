"""``evaluate.py analysis=heads|maps``'s options, checked before any work: the analysis
(:func:`check_analysis`) and its ``analysis_options`` (:func:`check_analysis_options`). Light: no
matplotlib, for evaluation's option checks (:mod:`transformer.evaluation.config_checks`)."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from transformer.analysis.heads import IMPORTANCES
from transformer.errors import ConfigError

ANALYSES = ("heads", "maps")


def check_analysis(kind: str | None) -> None:
    """``analysis``: one of :data:`ANALYSES`, or null."""
    if kind is not None and kind not in ANALYSES:
        raise ConfigError(f"analysis={kind}: choose one of {', '.join(ANALYSES)}, or null")


def number(options: DictConfig, name: str, kind: type[int] | type[float]) -> Any:
    """``analysis_options.<name>`` as ``kind``; a ConfigError naming the option if it is not one."""
    try:
        return kind(options[name])
    except (ValueError, TypeError) as err:
        what = "a whole number" if kind is int else "a number"
        raise ConfigError(f"analysis_options.{name}={options[name]!r} is not {what}") from err


def check_analysis_options(kind: str | None, options: DictConfig) -> None:
    """The ``analysis_options`` analysis ``kind`` reads (none without one): ``sentences``, and
    heads' ``importance``, ``normalize_by_layer`` and ``prune_step``, or maps' ``probes``."""
    if kind is None:
        return
    if options.sentences is not None:
        number(options, "sentences", int)
    if kind == "maps":
        number(options, "probes", int)
        return
    by = options.get("importance", "both")
    if by not in IMPORTANCES:
        raise ConfigError(f"analysis_options.importance={by}: choose one of "
                          f"{', '.join(IMPORTANCES)}")  # fmt: skip
    normalize = options.get("normalize_by_layer", False)
    if not isinstance(normalize, bool):
        raise ConfigError(f"analysis_options.normalize_by_layer={normalize!r}: true or false")
    number(options, "prune_step", float)
