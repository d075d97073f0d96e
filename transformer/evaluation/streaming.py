"""Output written a chunk at a time, and resumed after a kill: how ``evaluate.py input=FILE`` and
``score=true`` process files of any size; standard input (``input=-``) chunked as its lines arrive
(:func:`live_chunks`), so that each line's translation comes out while the writer waits for it.

Each input line (an item) gives a fixed number of output lines. A chunk's lines go to the output
file in one write, flushed and fsynced before the next chunk is read, so a kill leaves the chunks
before it whole and at most a part of one. The rule on resuming: the output holds the first
``complete lines // lines per item`` items (:func:`whole_items`); anything after them (a write cut
short) is truncated away, and the input resumes at the next item.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, TypeVar

from tqdm import tqdm

Item = TypeVar("Item")

READ_AHEAD = 2  # blocks of input lines a live reader holds before its consumer takes them
_END = object()  # the reader's last item: the input ended


def whole_items(path: Path, lines_per_item: int) -> tuple[int, int]:
    """(the items ``path`` holds whole, the bytes they take); (0, 0) when it does not exist. The
    caller truncates the file to those bytes to resume after them."""
    if not path.exists():
        return 0, 0
    lines, whole = 0, 0  # complete lines; bytes up to the end of the last whole item
    with open(path, "rb") as f:
        offset = 0
        for line in f:
            if not line.endswith(b"\n"):
                break
            offset, lines = offset + len(line), lines + 1
            if lines % lines_per_item == 0:
                whole = offset
    return lines // lines_per_item, whole


def append_chunks(
    path: Path,
    chunks: Iterable[tuple[int, list[Item]]],
    handle: Callable[[list[Item], int], list[str]],
    total: int | None = None,
    done: int = 0,
    echo: IO[bytes] | None = None,
) -> int:
    """Append ``handle(items, first)``'s output lines for each ``(first, items)`` chunk (``first``
    the index of its first item) to ``path``, one write each, and return the items written;
    with ``echo`` (evaluate.py's standard output), each chunk's lines there too, flushed, once
    they are in ``path``. Progress goes to a bar on standard error when it is a terminal
    (``total`` items, ``done`` already)."""
    written = 0
    with (
        open(path, "ab") as out,
        tqdm(total=total, initial=done, unit=" lines", disable=None, dynamic_ncols=True) as bar,
    ):
        for first, items in chunks:
            data = "".join(line + "\n" for line in handle(items, first)).encode("utf-8")
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
            if echo is not None:
                echo.write(data)
                echo.flush()
            written += len(items)
            bar.update(len(items))
    return written


def live_chunks(blocks: Iterable[list[str]], size: int) -> Iterator[tuple[int, list[str]]]:
    """(the index of its first line, lines) chunks of ``blocks``' lines as they arrive: each
    chunk is every line read by the time it is asked for, at most ``size``, and at least one (it
    waits for that one). A line is read once its line end is
    (:func:`transformer.data.text_files.line_blocks`), so an interactive writer's line is
    translated without waiting for more input; lines that arrive while a chunk is handled make
    the next chunk. A thread reads ``blocks`` (standard input) at most :data:`READ_AHEAD` blocks
    ahead; an error it meets (bytes that are not UTF-8) is raised here, after the lines before
    it."""
    lines: queue.Queue = queue.Queue(maxsize=READ_AHEAD)
    stop = threading.Event()  # the consumer is gone: the reader stops handing blocks over

    def put(item: object) -> bool:
        while not stop.is_set():
            try:
                lines.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def read() -> None:
        try:
            for block in blocks:
                if not put(block):
                    return
        except BaseException as err:  # raised in the consumer, after the lines before it
            put(err)
            return
        put(_END)

    threading.Thread(target=read, name="input-lines", daemon=True).start()
    pending: list[str] = []
    first, ended, error = 0, False, None
    try:
        while pending or not ended:
            wait = not pending  # for the first line of a chunk; then only what is there
            while not ended and len(pending) < size:
                try:
                    item = lines.get(block=wait)
                except queue.Empty:
                    break
                if item is _END or isinstance(item, BaseException):
                    ended, error = True, None if item is _END else item
                else:
                    pending, wait = pending + item, False
            if pending:
                chunk, pending = pending[:size], pending[size:]
                yield first, chunk
                first += len(chunk)
        if error is not None:
            raise error
    finally:
        stop.set()
