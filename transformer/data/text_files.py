"""Parallel text files: UTF-8 lines (plain or gzipped), a pair of files, TSV and JSONL, read as a
stream of chunks of sentence pairs, so that a corpus of any size passes through a bounded amount
of memory.

Bad input raises :class:`DataError` naming the file, the line or the counts, and what would fix it;
nothing is skipped silently.
"""

from __future__ import annotations

import codecs
import contextlib
import gzip
import json
import os
import sys
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import chain, islice, zip_longest
from pathlib import Path

from transformer.errors import DataError

CHUNK_PAIRS = 100_000  # sentence pairs a chunk: a few tens of MB of text
BLOCK_BYTES = 1 << 24  # bytes read (and decoded) at a time


@dataclass
class ParallelText:
    src: list[str]
    tgt: list[str]
    origin: str  # where the pairs came from, for messages

    @classmethod
    def join(cls, parts: Iterable[ParallelText], origin: str) -> ParallelText:
        text = cls([], [], origin)
        for part in parts:
            text.src += part.src
            text.tgt += part.tgt
        return text


def checked(
    parts: Iterable[ParallelText], split: str, langs: tuple[str, str], origin: str
) -> Iterator[ParallelText]:
    """``parts`` passed on as they come; after the last, a :class:`DataError` unless the split had
    pairs and each side a non-empty line."""
    pairs, filled = 0, [False, False]
    for part in parts:
        pairs += len(part.src)
        for k, side in enumerate((part.src, part.tgt)):
            filled[k] = filled[k] or any(line.strip() for line in side)
        yield part
    if not pairs:
        raise DataError(
            f"{origin}: split {split!r} is empty (no sentence pairs); fill the files or point "
            "data.root at another copy"
        )
    for lang, full in zip(langs, filled, strict=True):
        if not full:
            raise DataError(
                f"{origin}: every {lang} line of split {split!r} is empty; fill the file or point "
                "data.root at another copy"
            )


def _open_bytes(path: Path):
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def read_lines(path: str | os.PathLike) -> list[str]:
    """All lines of a UTF-8 text file (plain or ``.gz``) without their line ends
    (:func:`line_blocks`)."""
    return list(chain.from_iterable(iter_line_blocks(path)))


def iter_line_blocks(path: str | os.PathLike) -> Iterator[list[str]]:
    """The lines of a UTF-8 text file (plain or ``.gz``, or ``-``: standard input), a block of
    them at a time (:func:`line_blocks`). A file that cannot be read, or a ``.gz`` file that is
    not gzip or ends early, raises :class:`DataError` naming it."""
    origin = "input=-" if str(path) == "-" else str(path)
    try:
        opened = _open_input(path)
    except OSError as err:
        raise DataError(f"{origin} cannot be read ({err.strerror}); check the path") from err
    with opened as f:
        yield from line_blocks(_reads(f, origin), origin)


def _open_input(path: str | os.PathLike):
    if str(path) == "-":
        return contextlib.nullcontext(sys.stdin.buffer)
    return _open_bytes(Path(path))


def _reads(f, origin: str) -> Iterator[bytes]:
    """The bytes of ``f`` as they come (``read1``: a pipe's bytes without waiting for 16 MB); a
    damaged ``.gz`` or a read error becomes a :class:`DataError` naming ``origin``."""
    try:
        while block := f.read1(BLOCK_BYTES):
            yield block
    except gzip.BadGzipFile as err:
        raise DataError(
            f"{origin} is not a gzip file ({err}) although its name ends in .gz; compress it "
            "(gzip FILE) or drop the .gz from its name"
        ) from err
    except (EOFError, zlib.error) as err:
        raise DataError(
            f"{origin}: its gzip data is truncated or damaged ({err}); copy or download it "
            "again (gzip -t FILE tests a file)"
        ) from err
    except OSError as err:
        raise DataError(f"{origin} cannot be read ({err.strerror or err})") from err


def read_line_chunks(path: str, size: int, skip: int = 0) -> Iterator[tuple[int, list[str]]]:
    """(the index of its first line, up to ``size`` lines) chunks of a text file (``-`` for
    standard input) from line ``skip`` on, as :func:`iter_line_blocks` reads it."""
    lines = islice(chain.from_iterable(iter_line_blocks(path)), skip, None)
    while chunk := list(islice(lines, size)):
        yield skip, chunk
        skip += len(chunk)


def count_lines(path: str) -> int | None:
    """Lines of a plain file (a last one without its line end counts), counted in blocks; None
    for standard input and gzipped files (not known without reading them twice)."""
    if path == "-" or path.endswith(".gz"):
        return None
    count, last = 0, b"\n"
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            count, last = count + block.count(b"\n"), block[-1:]
    return count + (last != b"\n")


def line_count(source: str, read_through: bool) -> int | None:
    """A file's lines: a plain file's counted; a gzipped one's only when ``read_through`` (it is
    decompressed for it); None for standard input (``-``)."""
    if source == "-":
        return None
    total = count_lines(source)
    if total is None and read_through:
        total = sum(len(block) for block in iter_line_blocks(source))
    return total


def line_blocks(reads: Iterable[bytes], origin: str) -> Iterator[list[str]]:
    """Consecutive pieces of UTF-8 text -> lists of its lines without their line ends, each list
    the whole lines of one piece; ``origin`` names the input in errors.

    Only ``\\n`` separates lines (``\\r\\n`` is accepted too), never the other Unicode separators
    that ``str.splitlines`` would split on inside a sentence; a final line end adds no empty line.
    A UTF-8 byte-order mark at the start is dropped (it is not text); UTF-16 and UTF-32 (a
    byte-order mark that says so) and bytes that are not UTF-8 are refused, naming the line.
    """
    rest, line, first = b"", 1, True
    for data in reads:
        data = rest + data
        if first:  # once the first 4 bytes (the longest mark) are in, or a line end (no mark's)
            if len(data) < 4 and b"\n" not in data:
                rest = data
                continue
            data, first = _drop_bom(data, origin), False
        cut = data.rfind(b"\n") + 1
        rest = data[cut:]
        if cut:
            lines = _decode(data[: cut - 1], origin, line)
            line += len(lines)
            yield lines
    if first:  # all of it shorter than 4 bytes
        rest = _drop_bom(rest, origin)
        if rest.endswith(b"\n"):
            rest = rest[:-1]
            yield _decode(rest, origin, line)
            return
    if rest:
        yield _decode(rest, origin, line)


def _drop_bom(data: bytes, origin: str) -> bytes:
    if data.startswith(codecs.BOM_UTF8):
        return data[len(codecs.BOM_UTF8) :]
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):  # (UTF-32's include them)
        raise DataError(
            f"{origin}, line 1: a UTF-16 or UTF-32 byte-order mark; re-encode the text as UTF-8 "
            "(e.g. iconv -f utf-16 -t utf-8)"
        )
    return data


def _decode(data: bytes, origin: str, first_line: int) -> list[str]:
    """Lines ``first_line``, ... of the input: ``data`` without its final line end."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = first_line + data.count(b"\n", 0, err.start)
        raise DataError(
            f"{origin}, line {line}: bytes that are not UTF-8 ({data[err.start : err.end]!r}); "
            "re-encode the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)"
        ) from None
    lines = text.split("\n")
    if "\r" in text:
        lines = [s[:-1] if s.endswith("\r") else s for s in lines]
    return lines


def _chunks(pairs: Iterator[tuple], origin: str, chunk: int) -> Iterator[ParallelText]:
    while block := list(islice(pairs, chunk)):
        src, tgt = map(list, zip(*block, strict=True))
        yield ParallelText(src, tgt, origin)


def iter_parallel_files(
    src_path: Path, tgt_path: Path, chunk: int = CHUNK_PAIRS
) -> Iterator[ParallelText]:
    """One file per language, line i of one the translation of line i of the other."""
    lines = [chain.from_iterable(iter_line_blocks(p)) for p in (src_path, tgt_path)]
    pairs = zip_longest(*lines)
    done = 0
    for part in _chunks(pairs, f"{src_path} + {tgt_path}", chunk):
        if part.src[-1] is None or part.tgt[-1] is None:
            shorter = part.src if part.src[-1] is None else part.tgt
            counts = [done + len(part.src) + sum(1 for _ in pairs)] * 2
            counts[shorter is part.tgt] = done + shorter.index(None)
            raise DataError(
                f"{src_path} has {counts[0]} lines but {tgt_path} has {counts[1]}: parallel files "
                "must have one line per sentence pair; fix or replace the shorter/longer file"
            )
        done += len(part.src)
        yield part


def file_identity(*paths: Path) -> str:
    """Resolved path, size and modification time of each file: changes when a file does."""
    parts = []
    for p in paths:
        st = p.stat()
        parts.append(f"{p.resolve()}:{st.st_size}:{st.st_mtime_ns}")
    return "|".join(parts)


def _records(path: Path, parse: Callable[[int, str], tuple[str, str] | None]):
    """``parse(line_number, line)`` of each line of ``path``: its pairs, ``None`` skipped."""
    lines = chain.from_iterable(iter_line_blocks(path))
    return (p for n, line in enumerate(lines, start=1) if (p := parse(n, line)) is not None)


def iter_tsv(
    path: Path, src_lang: str, tgt_lang: str, chunk: int = CHUNK_PAIRS
) -> Iterator[ParallelText]:
    """A header line naming the languages (``en<TAB>de``), then one pair a line."""
    header: list[str] = []

    def parse(n: int, line: str) -> tuple[str, str] | None:
        fields = line.split("\t")
        if n == 1:
            header.extend(fields)
            for lang in (src_lang, tgt_lang):
                if lang not in header:
                    raise DataError(
                        f"{path}, line 1: the header {header} does not name language {lang!r}; "
                        "the first line of a TSV file names the language of each column"
                    )
            return None
        if len(fields) != len(header):
            raise DataError(
                f"{path}, line {n}: {len(fields)} tab-separated fields, the header has "
                f"{len(header)}; sentences must not contain tabs"
            )
        return fields[header.index(src_lang)], fields[header.index(tgt_lang)]

    yield from _chunks(_records(path, parse), str(path), chunk)


def iter_jsonl(
    path: Path, src_lang: str, tgt_lang: str, chunk: int = CHUNK_PAIRS
) -> Iterator[ParallelText]:
    """One JSON object a line, ``{"en": ..., "de": ...}`` or ``{"translation": {...}}``; blank
    lines are skipped."""

    def parse(n: int, line: str) -> tuple[str, str] | None:
        if not line.strip():
            return None
        try:
            obj = json.loads(line)
            pair = obj.get("translation", obj)
            return pair[src_lang], pair[tgt_lang]
        except (json.JSONDecodeError, KeyError, AttributeError, TypeError) as err:
            raise DataError(
                f"{path}, line {n}: not a JSON object with keys {src_lang!r} and "
                f"{tgt_lang!r} (or a 'translation' object with them): {err!r}"
            ) from None

    yield from _chunks(_records(path, parse), str(path), chunk)
