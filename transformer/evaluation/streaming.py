"""Output written a chunk at a time, and resumed after a kill: how ``evaluate.py input=FILE`` and
``score=true`` process files of any size.

Each input line (an item) gives a fixed number of output lines. A chunk's lines go to the output
file in one write, flushed and fsynced before the next chunk is read, so a kill leaves the chunks
before it whole and at most a part of one. The rule on resuming: the output holds the first
``complete lines // lines per item`` items (:func:`whole_items`); anything after them (a write cut
short) is truncated away, and the input resumes at the next item.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

from tqdm import tqdm

Item = TypeVar("Item")


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
) -> int:
    """Append ``handle(items, first)``'s output lines for each ``(first, items)`` chunk (``first``
    the index of its first item) to ``path``, one write each, and return the items written.
    Progress goes to a bar on standard error when it is a terminal (``total`` items, ``done``
    already)."""
    written = 0
    with (
        open(path, "ab") as out,
        tqdm(total=total, initial=done, unit=" lines", disable=None, dynamic_ncols=True) as bar,
    ):
        for first, items in chunks:
            out.write("".join(line + "\n" for line in handle(items, first)).encode("utf-8"))
            out.flush()
            os.fsync(out.fileno())
            written += len(items)
            bar.update(len(items))
    return written
