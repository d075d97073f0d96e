"""Evaluation: ``evaluate(cfg)`` (:mod:`transformer.evaluation.run`) scores a checkpoint on a
split, translates a file (``files``: chunked and resumable through ``streaming``) or scores given
translations; ``guides`` reads the target prefixes and terminology constraints (``terminology``)
that steer a search.

:func:`evaluate` is imported on first use, so that what needs only a light piece (reading
constraints, streaming a file) does not load the decoders and Lightning.
"""

from typing import Any

__all__ = ["evaluate"]


def __getattr__(name: str) -> Any:  # PEP 562
    if name == "evaluate":
        from transformer.evaluation.run import evaluate

        return evaluate
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
