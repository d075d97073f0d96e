"""How to decode: the one options type of greedy decoding, beam search, sampling, evaluation's
``decode.*`` and training's ``validation.decoding.*`` (both composed from
``transformer/configs/decode/``)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import InitVar, dataclass, fields
from typing import Any

from transformer.errors import ConfigError

STRATEGIES = ("greedy", "beam", "sample")
SAMPLING = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "seed": 0}  # options and their "off"


@dataclass(frozen=True)
class DecodeOptions:
    """The search, its length rules and what is printed of each translation, checked at
    construction.

    ``prefix`` is where the options come from as the user types them (``decode``,
    ``validation.decoding``): error messages name ``<prefix>.<option>``. ``strategies`` are the
    ones allowed there (validation decodes with greedy or beam only).
    """

    strategy: str = "beam"  # greedy (one translation, the cheapest) | beam | sample
    beam_size: int = 5  # beam only: hypotheses kept per sentence
    len_penalty: float = 1.0  # score = log-probability / length ** len_penalty (beam: its search)
    max_len_a: float = 1.2  # at most a * source length + b tokens before eos
    max_len_b: int = 10
    min_len: int = 1  # at least this many tokens before eos
    nbest: int = 1  # beam: hypotheses per sentence, best first (<= beam_size); sample: samples
    no_repeat_ngram_size: int = 0  # forbid repeating any n-gram of this size (0 = off)
    temperature: float = 1.0  # sample only: draw from softmax(logits / temperature)
    top_k: int = 0  # sample only: from the k likeliest tokens (0 = all)
    top_p: float = 1.0  # sample only: from the fewest likeliest tokens of total p >= top_p
    seed: int = 0  # sample only: a sentence's draws depend on seed and its index, nothing else
    score_prefix: bool = False  # target prefixes: their log-probabilities count in the score
    print_scores: bool = False  # input=...: write "score<TAB>translation"
    alignment: bool = False  # input=...: append "<TAB>src-tgt ..." word alignments
    alignment_layer: int = -1  # the decoder layer whose cross-attention aligns (-1 = last)
    alignment_head: int | None = None  # its head that aligns (None = the mean of its heads)
    # How the search runs, not what it finds
    # (docs/benchmarks.md#decoding-at-static-shapes-2026-11-26):
    graphs: bool | None = None  # each cached step a CUDA graph; None: on a GPU (not under autocast)
    sync_every: int = 0  # steps between reads of how many sentences are done; 0: 1 on CPU, 8 else
    # the whole search step (model and search) at static shapes, one CUDA graph where graphs are
    # on (on a CPU: eagerly, what a graph replays); false: the search's loop, the model's step alone
    # graphed. Off until it has run on a GPU (docs/evaluation.md)
    static_search: bool = False
    prefix: InitVar[str] = "decode"
    strategies: InitVar[Sequence[str]] = STRATEGIES

    def __post_init__(self, prefix: str, strategies: Sequence[str]) -> None:
        if self.strategy not in strategies:
            raise ConfigError(
                f"{prefix}.strategy={self.strategy!r}; choose one of "
                + " or ".join(repr(s) for s in strategies)
            )
        for name, integer, low in (
            ("beam_size", True, 1),
            ("len_penalty", False, None),
            ("max_len_a", False, 0),
            ("max_len_b", True, 0),
            ("min_len", True, 0),
            ("nbest", True, 1),
            ("no_repeat_ngram_size", True, 0),
            ("temperature", False, None),
            ("top_k", True, 0),
            ("top_p", False, None),
            ("seed", True, 0),
            ("alignment_layer", True, None),
            ("sync_every", True, 0),
        ):
            value = getattr(self, name)
            kinds = int if integer else (int, float)
            if isinstance(value, bool) or not isinstance(value, kinds) or not math.isfinite(value):
                kind = "an integer" if integer else "a number"
                raise ConfigError(f"{prefix}.{name} must be {kind}, got {value!r}")
            if low is not None and value < low:
                raise ConfigError(f"{prefix}.{name} must be >= {low}, got {value}")
        if self.temperature <= 0:
            raise ConfigError(
                f"{prefix}.temperature must be > 0, got {self.temperature}; for the likeliest "
                f"token set {prefix}.strategy=greedy"
            )
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"{prefix}.top_p must be in (0, 1], got {self.top_p} (1 = off)")
        for name in ("print_scores", "alignment", "score_prefix", "static_search"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(
                    f"{prefix}.{name} must be true or false, got {getattr(self, name)!r}"
                )
        if self.graphs is not None and not isinstance(self.graphs, bool):
            raise ConfigError(
                f"{prefix}.graphs must be true, false or null (on a GPU), got {self.graphs!r}"
            )
        head = self.alignment_head
        if head is not None and (isinstance(head, bool) or not isinstance(head, int) or head < 0):
            raise ConfigError(
                f"{prefix}.alignment_head must be a head index >= 0 or null (the mean of the "
                f"layer's heads), got {head!r}"
            )
        if self.strategy != "sample":
            for name, off in SAMPLING.items():
                if getattr(self, name) != off:
                    raise ConfigError(
                        f"{prefix}.{name}={getattr(self, name)} is a sampling option; set "
                        f"{prefix}.strategy=sample, or leave {name} at {off}"
                    )
        if self.strategy == "greedy" and self.nbest > 1:
            raise ConfigError(
                f"{prefix}.nbest={self.nbest}: greedy decoding gives one translation; set "
                f"{prefix}.strategy=beam (or sample, for {self.nbest} samples)"
            )
        if self.strategy == "beam" and self.nbest > self.beam_size:
            raise ConfigError(
                f"{prefix}.nbest={self.nbest} must be between 1 and beam_size={self.beam_size}"
            )

    @classmethod
    def from_dict(
        cls,
        options: Mapping[str, Any],
        prefix: str = "decode",
        strategies: Sequence[str] = STRATEGIES,
    ) -> DecodeOptions:
        """From a config mapping; an unknown key is a ValueError naming ``<prefix>.<key>``."""
        known = [f.name for f in fields(cls)]
        for key in options:
            if key not in known:
                raise ConfigError(f"unknown option {prefix}.{key}; known: {', '.join(known)}")
        return cls(**options, prefix=prefix, strategies=strategies)


def validation_decoding(options: Mapping[str, Any] | None) -> DecodeOptions:
    """The ``validation.decoding`` options (greedy unless they say otherwise), checked; messages
    name them ``validation.decoding.*``. ``train`` checks them here before any data work."""
    return DecodeOptions.from_dict(
        {"strategy": "greedy", **(options or {})},
        prefix="validation.decoding",
        strategies=("greedy", "beam"),
    )
