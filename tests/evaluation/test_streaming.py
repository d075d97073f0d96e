"""input=-: standard input chunked as its lines arrive (transformer.evaluation.streaming), each
chunk's results written to the run's file and echoed, flushed, to evaluate.py's stdout. The
whole command, a pipe held open: tests/evaluation/test_evaluate.py."""

from __future__ import annotations

import io
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path

import pytest

from transformer.data.text_files import iter_line_blocks
from transformer.errors import DataError
from transformer.evaluation.streaming import append_chunks, live_chunks


def test_a_line_is_chunked_as_it_arrives_while_the_pipe_stays_open(monkeypatch):
    read, write = os.pipe()  # standard input, its write end held open by the test
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(os.fdopen(read, "rb")))
    chunks = live_chunks(iter_line_blocks("-"), size=100)
    with ThreadPoolExecutor(1) as pool:
        try:
            os.write(write, b"a\n")  # shorter than a byte-order mark's 4 bytes: read all the same
            assert pool.submit(next, chunks).result(timeout=10) == (0, ["a"])
            os.write(write, b"the man sits\nin the park\n")  # one write: one chunk
            expected = (1, ["the man sits", "in the park"])
            assert pool.submit(next, chunks).result(timeout=10) == expected
            pending = pool.submit(next, chunks)
            os.write(write, b"half a li")  # no line end: no line yet
            with pytest.raises(FutureTimeout):
                pending.result(timeout=0.5)
            os.write(write, b"ne\n")
            assert pending.result(timeout=10) == (3, ["half a line"])
        finally:
            os.close(write)  # the end of the input
        with pytest.raises(StopIteration):
            pool.submit(next, chunks).result(timeout=10)


def test_chunks_hold_at_most_size_lines_and_an_error_comes_after_the_lines_before_it():
    def blocks():
        yield ["a", "b", "c", "d", "e"]
        raise DataError("input=-, line 6: bytes that are not UTF-8")

    chunks = live_chunks(blocks(), size=2)
    assert [next(chunks) for _ in range(3)] == [(0, ["a", "b"]), (2, ["c", "d"]), (4, ["e"])]
    with pytest.raises(DataError, match="line 6"):
        next(chunks)


def test_each_chunk_is_echoed_once_it_is_in_the_file(tmp_path: Path):
    class Echo(io.BytesIO):
        def __init__(self) -> None:
            super().__init__()
            self.flushed: list[bytes] = []

        def flush(self) -> None:
            self.flushed.append(out.read_bytes())  # the file, when this echo is flushed
            super().flush()

    out, echo = tmp_path / "out.txt", Echo()
    chunks = [(0, ["a", "b"]), (2, ["c"])]
    assert (
        append_chunks(out, chunks, lambda items, first: [s.upper() for s in items], echo=echo) == 3
    )
    assert echo.getvalue() == out.read_bytes() == b"A\nB\nC\n"
    assert echo.flushed == [b"A\nB\n", b"A\nB\nC\n"]
