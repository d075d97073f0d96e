"""evaluate's file modes: translate ``input=FILE`` (``decode.nbest`` lines a line) and score pairs
(``score=true``: a split's, or ``input=FILE``'s ``source<TAB>target`` lines), written to
``output`` a chunk of lines at a time and resumed after the lines it already holds, and to
evaluate.py's standard output as they come when there is no ``output``
(:mod:`transformer.evaluation.streaming`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from pathlib import Path
from typing import IO, Any

from omegaconf import DictConfig

from transformer.data.corpora import CorpusTexts
from transformer.data.text_files import iter_line_blocks, line_count, read_line_chunks
from transformer.decoding import DecodeOptions
from transformer.decoding.scoring import sentence_score
from transformer.errors import ConfigError, DataError
from transformer.evaluation.guides import ConstraintsMet, input_guides, named_guides
from transformer.evaluation.streaming import append_chunks, live_chunks, whole_items
from transformer.export.ct2_translate import CT2Translator
from transformer.outputs import check_not_input, same_file
from transformer.translate import Translator, output_lines

log = logging.getLogger(__name__)


RESULTS = ("hypotheses.txt", "metrics.json", "scores.txt")  # a run's, in its run directory


def files_read(cfg: DictConfig, checkpoints: list[str]) -> list[str]:
    """Every file evaluate reads that is known before any work: ``input`` (not standard input),
    ``prefixes``, ``constraints``, ``reference`` and the checkpoints (each file of an exported
    model directory, its tokenizers among them). A split's files come with its corpus
    (:func:`check_outputs`)."""
    given = [None if cfg.input == "-" else cfg.input, cfg.prefixes, cfg.get("constraints"),
             cfg.get("reference")]  # fmt: skip
    files = [str(p) for p in given if p is not None]
    for path in map(Path, checkpoints):
        files += (
            sorted(str(p) for p in path.rglob("*") if p.is_file()) if path.is_dir() else [str(path)]
        )
    return files


def check_outputs(cfg: DictConfig, out_dir: Path, inputs: Iterable[str | os.PathLike]) -> None:
    """Before anything is written: ``output`` is none of ``inputs`` (:func:`files_read`, a split's
    files) and no directory, and no input is a result the run directory gets (:data:`RESULTS`,
    deleted when the run starts)."""
    inputs = list(inputs)
    if cfg.output is not None:
        check_not_input(
            str(cfg.output),
            inputs,
            "output={output} is {given}, an input of this run, which writing it would destroy; "
            "give output= a new file",
            "output={output} is a directory; give output= a file",
        )
    for given in inputs:
        for name in RESULTS:
            if same_file(out_dir / name, given):
                raise ConfigError(
                    f"{given} is {out_dir / name}, where this run writes its {name}: it would be "
                    "deleted before it is read; give the run another directory (hydra.run.dir=DIR)"
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


def _input_file(
    cfg: DictConfig, out_dir: Path, default: str, lines_per_item: int
) -> tuple[Path, int, Iterator[tuple[int, list[str]]], int | None]:
    """``input``'s results file and the items it holds (:func:`_output`), the lines still to do
    in chunks (each with its first line's index; standard input's as its lines arrive:
    :func:`transformer.evaluation.streaming.live_chunks`), and its line count if known without
    reading it through (for the progress bar)."""
    source = str(cfg.input)
    count = partial(line_count, source, read_through=True)
    path, done = _output(cfg, out_dir, default, lines_per_item, count, f"input={source}")
    if source == "-":  # as the lines arrive (resuming is refused: done is 0)
        chunks = live_chunks(iter_line_blocks(source), cfg.input_chunk)
    else:
        chunks = read_line_chunks(source, cfg.input_chunk, skip=done)
    return path, done, chunks, line_count(source, read_through=False)


def translate_file(
    cfg: DictConfig,
    translator: Translator | CT2Translator,
    options: DecodeOptions,
    max_tokens: int,
    out_dir: Path,
    echo: IO[bytes] | None = None,
) -> dict[str, Any]:
    """input=FILE: its translations, ``options.nbest`` lines per line, written as they come (to
    ``echo`` too, flushed, when given); with ``prefixes=FILE`` and ``constraints=FILE``, each
    line's read beside it (:func:`transformer.evaluation.guides.input_guides`)."""
    path, done, chunks, total = _input_file(cfg, out_dir, "hypotheses.txt", options.nbest)
    chunks, wanted = input_guides(cfg, chunks, done)  # wanted: each line's phrases, or None
    met = None if wanted is None else ConstraintsMet(cfg)

    def translate(items: list, first: int) -> list[str]:
        lines, prefixes = items, None
        if cfg.prefixes is not None:  # (line, prefix) pairs
            lines, prefixes = [line for line, _ in items], [p for _, p in items]
        phrases = None if wanted is None else wanted[first : first + len(lines)]
        more = {} if phrases is None else {"constraints": phrases}  # our engine's alone
        with named_guides(cfg):
            out = translator.translate(lines, options, max_tokens, first, prefixes=prefixes, **more)
        if met is not None:
            met.count([t[0].text for t in out], phrases, translator.tgt_tokenizer)
        return output_lines(out, options)

    written = append_chunks(path, chunks, translate, total, done, echo)
    result = {"output": str(path), "lines": done + written, "resumed_at": done}
    if met is not None:  # of the lines translated by this run
        result["constraints"] = met.record()
    return result


def score_pairs(
    cfg: DictConfig,
    translator: Translator,
    max_tokens: int,
    out_dir: Path,
    texts: Callable[[], CorpusTexts],
    echo: IO[bytes] | None = None,
) -> dict[str, Any]:
    """score=true: the forced score of each pair of the split (of ``texts()``, the checkpoint's
    corpus) or of input=FILE's ``source<TAB>target`` lines, one line each (to ``echo`` too,
    flushed, when given)."""
    len_penalty, per_token = float(cfg.scoring.len_penalty), cfg.scoring.per_token
    if cfg.input is not None:
        path, done, lines, total = _input_file(cfg, out_dir, "scores.txt", 1)
        source = str(cfg.input)
        chunks = ((first, _pairs(chunk, first, source)) for first, chunk in lines)
    else:
        corpus = texts()
        split = corpus.pairs(cfg.split, cfg.direction)
        check_outputs(cfg, out_dir, corpus.files(cfg.split, cfg.direction))
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

    written = append_chunks(path, chunks, score, total, done, echo)
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
