"""evaluate's guides to the search, files line-aligned with what it translates: ``prefixes=FILE``
(the start of each translation, one a line) and ``constraints=FILE`` (target phrases each must
hold, one JSON list a line). Checked before any work; read for a split, or beside ``input=FILE``
in its chunks; the share of constraints met summed for metrics.json."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from itertools import chain, islice
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from transformer.data.text_files import iter_line_blocks, line_count, read_lines
from transformer.data.tokenizer import Tokenizer
from transformer.decoding import DecodeOptions
from transformer.errors import ConfigError, DataError, GuideError
from transformer.evaluation.terminology import constraints_met, read_constraints

log = logging.getLogger(__name__)


def check_guides(cfg: DictConfig, options: DecodeOptions, analysis: str | None) -> None:
    """Before any work: each guide file exists and the run makes translations it can guide;
    prefixes on either engine (CTranslate2 not counting them in the score), constraints by our
    beam search on a split or input=FILE."""
    engine = cfg.get("engine", "torch")
    for option, path in (("prefixes", cfg.prefixes), ("constraints", cfg.get("constraints"))):
        if path is None:
            continue
        if cfg.score or analysis is not None:
            name = "score=true" if cfg.score else f"analysis={analysis}"
            raise ConfigError(f"{option}={path} guides translations; {name} makes none")
        if not Path(str(path)).is_file():
            kind = "one prefix a line" if option == "prefixes" else "one JSON list a line"
            raise ConfigError(f"{option}={path}: no such file ({kind})")
    if cfg.prefixes is not None and options.score_prefix and engine == "ctranslate2":
        raise ConfigError("decode.score_prefix=true: CTranslate2 leaves prefixes out of its "
                          "scores; use engine=torch")  # fmt: skip
    path = cfg.get("constraints")
    if path is None:
        return
    for wrong, name in (
        (engine != "torch", f"engine={engine}"),
        (options.strategy != "beam", f"decode.strategy={options.strategy}"),
        (cfg.input == "-", "input=- (standard input, whose lines cannot be counted first)"),
    ):
        if wrong:
            raise ConfigError(
                f"constraints={path} needs our beam search translating a split or input=FILE; "
                f"leave out {name} (or the constraints)"
            )


@contextlib.contextmanager
def named_guides(cfg: DictConfig) -> Iterator[None]:
    """Translating with ``cfg``'s guides: an error about one line's prefix or constraint (the
    translator's, which knows lines, not files) names its file."""
    try:
        yield
    except GuideError as err:
        raise DataError(f"{err.option}={cfg[err.option]}, {err}") from err


def split_guides(cfg: DictConfig, sentences: int) -> dict[str, list]:
    """``translate``'s guides for a split of ``sentences`` sentences: ``prefixes`` and
    ``constraints``, those given, one a sentence."""
    guides: dict[str, list] = {}
    if cfg.prefixes is not None:
        guides["prefixes"] = read_lines(str(cfg.prefixes))
        if len(guides["prefixes"]) != sentences:
            raise _count_mismatch(cfg, len(guides["prefixes"]), f"split={cfg.split}", sentences)
    if cfg.get("constraints") is not None:
        guides["constraints"] = read_constraints(
            str(cfg.constraints), sentences, f"split={cfg.split}"
        )
    return guides


class ConstraintsMet:
    """``constraints=FILE``'s phrases met and given, summed over the translations counted."""

    def __init__(self, cfg: DictConfig) -> None:
        self.file, self.met, self.total = str(cfg.constraints), 0, 0

    def count(self, translations: Sequence[str], phrases: Sequence[Sequence[str]],
              tokenizer: Tokenizer) -> None:  # fmt: skip
        met, total = constraints_met(translations, phrases, tokenizer)
        self.met, self.total = self.met + met, self.total + total

    def record(self) -> dict[str, Any]:
        """For metrics.json (and evaluate's result), said in the log too."""
        log.info("constraints met: %d of %d phrases", self.met, self.total)
        return {"file": self.file, "met": self.met, "total": self.total}


def _count_mismatch(cfg: DictConfig, prefixes: int, origin: str, lines: int | str) -> DataError:
    return DataError(
        f"prefixes={cfg.prefixes} has {prefixes} lines but {origin} has {lines}: give one "
        "prefix a line, line for line (an empty line: no prefix)"
    )


def input_guides(
    cfg: DictConfig, chunks: Iterator[tuple[int, list[str]]], done: int
) -> tuple[Iterator[tuple[int, list]], list[list[str]] | None]:
    """input=FILE's guides, from line ``done`` on: its chunks of lines, as (line, prefix) pairs
    with ``prefixes=FILE`` (:func:`_with_prefixes`), and ``constraints=FILE``'s phrases, a list
    a line (None without it). The input's lines are counted once, for both files."""
    if cfg.prefixes is None and cfg.get("constraints") is None:
        return chunks, None
    lines = line_count(str(cfg.input), read_through=True)  # None: standard input
    wanted = None
    if cfg.get("constraints") is not None:
        wanted = read_constraints(str(cfg.constraints), lines, f"input={cfg.input}")
    if cfg.prefixes is not None:
        chunks = _with_prefixes(cfg, chunks, done, lines)
    return chunks, wanted


def _with_prefixes(
    cfg: DictConfig, chunks: Iterator[tuple[int, list[str]]], done: int, lines: int | None
) -> Iterator[tuple[int, list[tuple[str, str]]]]:
    """input=...'s chunks of lines as chunks of (line, its prefix) pairs, ``prefixes=FILE`` read
    line for line beside them from line ``done`` on (the chunks of standard input have the
    sizes its lines arrive in). ``lines``: the input's line count (None for standard input).
    Line counts are compared here, before any translation (input=FILE), or as the lines come
    (input=-): a difference is a DataError naming both files and their counts, never a
    misalignment."""
    source, counted = str(cfg.input), line_count(str(cfg.prefixes), read_through=True)
    if lines is not None and lines != counted:
        raise _count_mismatch(cfg, counted, f"input={source}", lines)
    given = islice(chain.from_iterable(iter_line_blocks(str(cfg.prefixes))), done, None)
    return _paired(cfg, chunks, given, counted, done)


def _paired(
    cfg: DictConfig,
    chunks: Iterator[tuple[int, list[str]]],
    prefixes: Iterator[str],
    counted: int,
    seen: int,
) -> Iterator[tuple[int, list[tuple[str, str]]]]:
    for first, chunk in chunks:
        given = list(islice(prefixes, len(chunk)))
        seen = first + len(chunk)
        if len(given) < len(chunk):  # the prefixes ended first
            raise _count_mismatch(cfg, counted, f"input={cfg.input}", f"{seen} or more")
        yield first, list(zip(chunk, given, strict=True))
    if next(prefixes, None) is not None:  # the input ended first
        raise _count_mismatch(cfg, counted, f"input={cfg.input}", seen)
