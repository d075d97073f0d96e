"""How to decode: the one options type of greedy decoding, beam search, evaluation's ``decode.*``
and training's ``validation.decoding.*`` (both composed from ``configs/decode/``)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import InitVar, dataclass, fields
from typing import Any

from transformer.errors import ConfigError

STRATEGIES = ("greedy", "beam")


@dataclass(frozen=True)
class DecodeOptions:
    """The search and its length rules, checked at construction.

    ``prefix`` is where the options come from as the user types them (``decode``,
    ``validation.decoding``): error messages name ``<prefix>.<option>``.
    """

    strategy: str = "beam"  # greedy (one translation, the cheapest) | beam
    beam_size: int = 5  # beam only: hypotheses kept per sentence
    len_penalty: float = 1.0  # beam only: score = log-probability / length ** len_penalty
    max_len_a: float = 1.2  # at most a * source length + b tokens before eos
    max_len_b: int = 10
    min_len: int = 1  # at least this many tokens before eos
    nbest: int = 1  # beam only: hypotheses per sentence, best first (<= beam_size)
    no_repeat_ngram_size: int = 0  # forbid repeating any n-gram of this size (0 = off)
    prefix: InitVar[str] = "decode"

    def __post_init__(self, prefix: str) -> None:
        if self.strategy not in STRATEGIES:
            raise ConfigError(
                f"{prefix}.strategy={self.strategy!r}; choose one of "
                + " or ".join(repr(s) for s in STRATEGIES)
            )
        for name, integer, low in (
            ("beam_size", True, 1),
            ("len_penalty", False, None),
            ("max_len_a", False, 0),
            ("max_len_b", True, 0),
            ("min_len", True, 0),
            ("nbest", True, 1),
            ("no_repeat_ngram_size", True, 0),
        ):
            value = getattr(self, name)
            kinds = int if integer else (int, float)
            if isinstance(value, bool) or not isinstance(value, kinds) or not math.isfinite(value):
                kind = "an integer" if integer else "a number"
                raise ConfigError(f"{prefix}.{name} must be {kind}, got {value!r}")
            if low is not None and value < low:
                raise ConfigError(f"{prefix}.{name} must be >= {low}, got {value}")
        if self.strategy == "greedy" and self.nbest > 1:
            raise ConfigError(
                f"{prefix}.nbest={self.nbest}: greedy decoding gives one translation; set "
                f"{prefix}.strategy=beam"
            )
        if self.nbest > self.beam_size:
            raise ConfigError(
                f"{prefix}.nbest={self.nbest} must be between 1 and beam_size={self.beam_size}"
            )

    @classmethod
    def from_dict(cls, options: Mapping[str, Any], prefix: str = "decode") -> DecodeOptions:
        """From a config mapping; an unknown key is a ValueError naming ``<prefix>.<key>``."""
        known = [f.name for f in fields(cls)]
        for key in options:
            if key not in known:
                raise ConfigError(f"unknown option {prefix}.{key}; known: {', '.join(known)}")
        return cls(**options, prefix=prefix)
