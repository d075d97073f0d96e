"""evaluate's file modes: translate ``input=FILE`` (``decode.nbest`` lines a line) and score pairs
(``score=true``: a split's, or ``input=FILE``'s ``source<TAB>target`` lines), written to
``output`` a chunk of lines at a time and resumed after the lines it already holds
(:mod:`transformer.streaming`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from functools import partial
from itertools import zip_longest
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from transformer.data.corpora import CorpusTexts
from transformer.data.text_files import (
    count_lines,
    iter_line_blocks,
    read_line_chunks,
    read_lines,
)
from transformer.decoding import DecodeOptions
from transformer.decoding.scoring import sentence_score
from transformer.errors import ConfigError, DataError
from transformer.export.ct2_translate import CT2Translator
from transformer.outputs import check_not_input
from transformer.streaming import append_chunks, whole_items
from transformer.terminology import constraints_met, read_constraints
from transformer.translate import Translator, output_lines

log = logging.getLogger(__name__)


def check_outputs(cfg: DictConfig, checkpoints: list[str]) -> None:
    """Before any work: ``output`` is neither the input nor a checkpoint nor a directory."""
    if cfg.output is not None:
        inputs = [*([] if cfg.input in (None, "-") else [str(cfg.input)]), *checkpoints]
        check_not_input(
            str(cfg.output),
            inputs,
            "output={output} is {given}, an input of this run, which writing it would destroy; "
            "give output= a new file",
            "output={output} is a directory; give output= a file",
        )


def _output(
    cfg: DictConfig,
    out_dir: Path,
    default: str,
    lines_per_item: int,
    count: Callable[[], int | None],
    origin: str,
) -> tuple[Path, int]:
    """Where a file's results go (``output``, or ``default`` in the run directory) and how many
    items it already holds. An ``output`` is resumed after its whole items (``force=true``: none,
    it is emptied) once they are checked against the input's count (``count()``, None where the
    input cannot be read again: stdin): an output holding more, or one that cannot be checked,
    is refused unchanged."""
    if cfg.output is None:
        return out_dir / default, 0
    path = Path(str(cfg.output))
    path.parent.mkdir(parents=True, exist_ok=True)
    if cfg.force:
        path.write_bytes(b"")
        return path, 0
    done, size = whole_items(path, lines_per_item)
    if done:
        total = count()
        if total is None:
            raise ConfigError(
                f"output={cfg.output} holds the results of {done} lines; resuming would skip the "
                f"first {done} lines of {origin} (standard input, which cannot be read again to "
                "check them): give the input as input=FILE, or force=true to start output= again"
            )
        if done > total:
            raise ConfigError(
                f"output={cfg.output} holds results for {done} lines but {origin} has {total}: it "
                "belongs to another input; delete it, choose another output=, or force=true to "
                "replace it"
            )
        log.info("%s holds the results of %d lines: resuming at line %d", path, done, done + 1)
    if path.exists():
        os.truncate(path, size)  # a write cut short
    return path, done


def _line_count(source: str, read_through: bool) -> int | None:
    """``input``'s lines: a plain file's counted; a gzipped one's only when ``read_through`` (it
    is decompressed for it); None for standard input."""
    if source == "-":
        return None
    total = count_lines(source)
    if total is None and read_through:
        total = sum(len(block) for block in iter_line_blocks(source))
    return total


def _input_file(
    cfg: DictConfig, out_dir: Path, default: str, lines_per_item: int
) -> tuple[Path, int, Iterator[tuple[int, list[str]]], int | None]:
    """``input``'s results file and the items it holds (:func:`_output`), the lines still to do
    in chunks (each with its first line's index), and its line count if known without reading
    it through (for the progress bar)."""
    source = str(cfg.input)
    count = partial(_line_count, source, read_through=True)
    path, done = _output(cfg, out_dir, default, lines_per_item, count, f"input={source}")
    chunks = read_line_chunks(source, cfg.input_chunk, skip=done)
    return path, done, chunks, _line_count(source, read_through=False)


def translate_file(
    cfg: DictConfig,
    translator: Translator | CT2Translator,
    options: DecodeOptions,
    max_tokens: int,
    out_dir: Path,
) -> dict[str, Any]:
    """input=FILE: its translations, ``options.nbest`` lines per line, written as they come;
    with ``prefixes=FILE``, each line's prefix read beside it (:func:`with_prefixes`)."""
    path, done, chunks, total = _input_file(cfg, out_dir, "hypotheses.txt", options.nbest)
    wanted, met = None, [0, 0]  # constraints=FILE: each line's phrases; phrases met, phrases
    lines = None  # the input's, counted once for the files beside it (None: standard input)
    if cfg.get("constraints") is not None or cfg.prefixes is not None:
        lines = _line_count(str(cfg.input), read_through=True)
    if cfg.get("constraints") is not None:
        wanted = read_constraints(str(cfg.constraints), lines, f"input={cfg.input}")
    if cfg.prefixes is not None:
        chunks = with_prefixes(cfg, chunks, done, lines)

    def translate(items: list, first: int) -> list[str]:
        lines, prefixes = items, None
        if cfg.prefixes is not None:  # (line, prefix) pairs
            lines, prefixes = [line for line, _ in items], [p for _, p in items]
        phrases = None if wanted is None else wanted[first : first + len(lines)]
        more = {} if phrases is None else {"constraints": phrases}  # our engine's alone
        out = translator.translate(lines, options, max_tokens, first, prefixes=prefixes, **more)
        if phrases is not None:
            counts = constraints_met([t[0].text for t in out], phrases, translator.tgt_tokenizer)
            met[:] = [met[0] + counts[0], met[1] + counts[1]]
        return output_lines(out, options)

    written = append_chunks(path, chunks, translate, total, done)
    result = {"output": str(path), "lines": done + written, "resumed_at": done}
    if wanted is not None:  # of the lines translated by this run
        log.info("constraints met: %d of %d phrases", *met)
        result["constraints"] = {"file": str(cfg.constraints), "met": met[0], "total": met[1]}
    return result


def check_prefixes(cfg: DictConfig, options: DecodeOptions, analysis: str | None) -> None:
    """``prefixes=FILE``, before any work: a file, for translations (not ``score=true`` nor an
    analysis), and with ``engine=ctranslate2`` not counted in the score (it cannot)."""
    if cfg.prefixes is None:
        return
    if cfg.score or analysis is not None:
        name = "score=true" if cfg.score else f"analysis={analysis}"
        raise ConfigError(f"prefixes={cfg.prefixes} starts translations; {name} makes none")
    if not Path(str(cfg.prefixes)).is_file():
        raise ConfigError(f"prefixes={cfg.prefixes}: no such file (one prefix a line)")
    if options.score_prefix and cfg.get("engine", "torch") == "ctranslate2":
        raise ConfigError("decode.score_prefix=true: CTranslate2 leaves prefixes out of its "
                          "scores; use engine=torch")  # fmt: skip


def _count_mismatch(cfg: DictConfig, prefixes: int, origin: str, lines: int | str) -> DataError:
    return DataError(
        f"prefixes={cfg.prefixes} has {prefixes} lines but {origin} has {lines}: give one "
        "prefix a line, line for line (an empty line: no prefix)"
    )


def split_prefixes(cfg: DictConfig, sentences: int) -> list[str] | None:
    """``prefixes=FILE``'s lines for a split of ``sentences`` sentences, one each."""
    if cfg.prefixes is None:
        return None
    prefixes = read_lines(str(cfg.prefixes))
    if len(prefixes) != sentences:
        raise _count_mismatch(cfg, len(prefixes), f"split={cfg.split}", sentences)
    return prefixes


def with_prefixes(
    cfg: DictConfig, chunks: Iterator[tuple[int, list[str]]], done: int, lines: int | None
) -> Iterator[tuple[int, list[tuple[str, str]]]]:
    """input=...'s chunks of lines as chunks of (line, its prefix) pairs, ``prefixes=FILE``
    read in the same chunks from line ``done`` on. ``lines``: the input's line count (None for
    standard input). Line counts are compared here, before any translation (input=FILE), or as
    the lines come (input=-): a difference is a DataError naming both files and their counts,
    never a misalignment."""
    source, counted = str(cfg.input), _line_count(str(cfg.prefixes), read_through=True)
    if lines is not None and lines != counted:
        raise _count_mismatch(cfg, counted, f"input={source}", lines)
    prefix_chunks = read_line_chunks(str(cfg.prefixes), cfg.input_chunk, done)
    return _paired(cfg, chunks, prefix_chunks, counted)


def _paired(
    cfg: DictConfig,
    chunks: Iterator[tuple[int, list[str]]],
    prefix_chunks: Iterator[tuple[int, list[str]]],
    counted: int,
) -> Iterator[tuple[int, list[tuple[str, str]]]]:
    for (first, chunk), (start, given) in zip_longest(chunks, prefix_chunks, fillvalue=(-1, [])):
        if len(chunk) != len(given):  # the shorter chunk is its file's last
            seen = max(first, start) + len(chunk)
            lines = f"{seen} or more" if len(chunk) > len(given) else seen
            raise _count_mismatch(cfg, counted, f"input={cfg.input}", lines)
        yield first, list(zip(chunk, given, strict=True))


def score_pairs(
    cfg: DictConfig,
    translator: Translator,
    max_tokens: int,
    out_dir: Path,
    texts: Callable[[], CorpusTexts],
) -> dict[str, Any]:
    """score=true: the forced score of each pair of the split (of ``texts()``, the checkpoint's
    corpus) or of input=FILE's ``source<TAB>target`` lines, one line each."""
    len_penalty, per_token = float(cfg.scoring.len_penalty), cfg.scoring.per_token
    if cfg.input is not None:
        path, done, lines, total = _input_file(cfg, out_dir, "scores.txt", 1)
        source = str(cfg.input)
        chunks = ((first, _pairs(chunk, first, source)) for first, chunk in lines)
    else:
        split = texts().pairs(cfg.split, cfg.direction)
        pairs = list(zip(split.src, split.tgt, strict=True))
        step, total = cfg.input_chunk, len(pairs)
        path, done = _output(cfg, out_dir, "scores.txt", 1, lambda: total, f"split={cfg.split}")
        chunks = ((i, pairs[i : i + step]) for i in range(done, total, step))

    def score(items: list[tuple[str, str]], first: int) -> list[str]:
        sources, targets = [s for s, _ in items], [t for _, t in items]
        out = []
        for lprobs in translator.score(sources, targets, max_tokens):
            line = f"{sentence_score(lprobs, len_penalty):.4f}"
            tokens = "\t" + " ".join(f"{x:.4f}" for x in lprobs) if per_token else ""
            out.append(line + tokens)
        return out

    written = append_chunks(path, chunks, score, total, done)
    return {"output": str(path), "lines": done + written, "resumed_at": done}


def _pairs(lines: list[str], first: int, origin: str) -> list[tuple[str, str]]:
    """``source<TAB>target`` lines -> pairs; line ``first`` + 1 is the first's number."""
    pairs = []
    for number, line in enumerate(lines, start=first + 1):
        fields = line.split("\t")
        if len(fields) != 2:
            raise DataError(
                f"{origin}, line {number}: {len(fields)} tab-separated fields; score=true "
                "reads one pair a line, source<TAB>target"
            )
        pairs.append((fields[0], fields[1]))
    return pairs
