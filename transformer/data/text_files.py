"""Parallel text files: UTF-8 lines (plain or gzipped), a pair of files, TSV and JSONL.

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
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from transformer.errors import DataError


@dataclass
class ParallelText:
    src: list[str]
    tgt: list[str]
    origin: str  # where the pairs came from, for messages

    def check_filled(self, split: str, langs: tuple[str, str]) -> None:
        """Raise unless the split has pairs and each side a non-empty line."""
        if not self.src:
            raise DataError(
                f"{self.origin}: split {split!r} is empty (no sentence pairs); fill the files or "
                "point data.root at another copy"
            )
        for lang, side in zip(langs, (self.src, self.tgt), strict=True):
            if not any(line.strip() for line in side):
                raise DataError(
                    f"{self.origin}: every {lang} line of split {split!r} is empty; fill the file "
                    "or point data.root at another copy"
                )


def _open_bytes(path: Path):
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def read_lines(path: str | os.PathLike) -> list[str]:
    """All lines of a UTF-8 text file (plain or ``.gz``) without their line ends
    (:func:`split_lines`)."""
    path = Path(path)
    with _open_bytes(path) as f:
        return split_lines(f.read(), str(path))


def split_lines(data: bytes, origin: str) -> list[str]:
    """UTF-8 bytes -> lines without their line ends; ``origin`` names the input in errors.

    Only ``\\n`` separates lines (``\\r\\n`` is accepted too), never the other Unicode separators
    that ``str.splitlines`` would split on inside a sentence. A UTF-8 byte-order mark at the start
    is dropped (it is not text); UTF-16 and UTF-32 (a byte-order mark that says so) and bytes that
    are not UTF-8 are refused, naming the line.
    """
    data = _drop_bom(data, origin)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise _not_utf8(origin, line, data[err.start : err.end]) from None
    if text.endswith("\n"):
        text = text[:-1]
    lines = text.split("\n") if text else []
    return [s[:-1] if s.endswith("\r") else s for s in lines]


def _drop_bom(data: bytes, origin: str) -> bytes:
    """The text without a UTF-8 byte-order mark; a UTF-16 or UTF-32 one is refused."""
    if data.startswith(codecs.BOM_UTF8):
        return data[len(codecs.BOM_UTF8) :]
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):  # (UTF-32's include them)
        raise DataError(
            f"{origin}, line 1: a UTF-16 or UTF-32 byte-order mark; re-encode the text as UTF-8 "
            "(e.g. iconv -f utf-16 -t utf-8)"
        )
    return data


def _not_utf8(origin: str, line: int, bad: bytes) -> DataError:
    return DataError(
        f"{origin}, line {line}: bytes that are not UTF-8 ({bad!r}); re-encode the file as UTF-8 "
        "(e.g. iconv -f latin1 -t utf-8)"
    )


def _open_input(path: str):
    """A text source as bytes: ``-`` (standard input), a ``.gz`` file or a plain one."""
    if path == "-":
        return contextlib.nullcontext(sys.stdin.buffer)
    return _open_bytes(Path(path))


def read_line_chunks(path: str, size: int, skip: int = 0) -> Iterator[tuple[int, list[str]]]:
    """(the index of its first line, up to ``size`` lines) chunks of a text file (``-`` for
    standard input), from line ``skip`` on, without reading the file whole: the lines and errors
    :func:`split_lines` gives the whole file. Lines before ``skip`` are read, not decoded."""
    origin = "input=-" if path == "-" else path
    chunk: list[str] = []
    with _open_input(path) as f:
        for number, raw in enumerate(f):  # bytes up to and with each b"\n"
            if number == 0:
                raw = _drop_bom(raw, origin)
            if number < skip:
                continue
            raw = raw.removesuffix(b"\n").removesuffix(b"\r")
            try:
                chunk.append(raw.decode("utf-8"))
            except UnicodeDecodeError as err:
                raise _not_utf8(origin, number + 1, raw[err.start : err.end]) from None
            if len(chunk) == size:
                yield number + 1 - size, chunk
                chunk = []
    if chunk:
        yield number + 1 - len(chunk), chunk


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


def read_parallel_files(src_path: Path, tgt_path: Path) -> ParallelText:
    """One file per language, line i of one the translation of line i of the other."""
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    if len(src) != len(tgt):
        raise DataError(
            f"{src_path} has {len(src)} lines but {tgt_path} has {len(tgt)}: parallel files must "
            "have one line per sentence pair; fix or replace the shorter/longer file"
        )
    return ParallelText(src, tgt, f"{src_path} + {tgt_path}")


def file_identity(*paths: Path) -> str:
    """Resolved path, size and modification time of each file: changes when a file does."""
    parts = []
    for p in paths:
        st = p.stat()
        parts.append(f"{p.resolve()}:{st.st_size}:{st.st_mtime_ns}")
    return "|".join(parts)


def read_tsv(path: Path, src_lang: str, tgt_lang: str) -> ParallelText:
    """A header line naming the languages (``en<TAB>de``), then one pair a line."""
    lines = read_lines(path)
    header = lines[0].split("\t") if lines else []
    for lang in (src_lang, tgt_lang):
        if lang not in header:
            raise DataError(
                f"{path}, line 1: the header {header} does not name language {lang!r}; the "
                "first line of a TSV file names the language of each column"
            )
    si, ti = header.index(src_lang), header.index(tgt_lang)
    src, tgt = [], []
    for n, line in enumerate(lines[1:], start=2):
        fields = line.split("\t")
        if len(fields) != len(header):
            raise DataError(
                f"{path}, line {n}: {len(fields)} tab-separated fields, the header has "
                f"{len(header)}; sentences must not contain tabs"
            )
        src.append(fields[si])
        tgt.append(fields[ti])
    return ParallelText(src, tgt, str(path))


def read_jsonl(path: Path, src_lang: str, tgt_lang: str) -> ParallelText:
    """One JSON object a line, ``{"en": ..., "de": ...}`` or ``{"translation": {...}}``; blank
    lines are skipped."""
    lines = read_lines(path)
    src, tgt = [], []
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            pair = obj.get("translation", obj)
            src.append(pair[src_lang])
            tgt.append(pair[tgt_lang])
        except (json.JSONDecodeError, KeyError, AttributeError, TypeError) as err:
            raise DataError(
                f"{path}, line {n}: not a JSON object with keys {src_lang!r} and "
                f"{tgt_lang!r} (or a 'translation' object with them): {err!r}"
            ) from None
    return ParallelText(src, tgt, str(path))
