"""glibc's heap for long decoding runs: an mmap threshold that stays where it is set.

Decoding allocates tensors of a new size at almost every step (a batch's rows shrink as its
sentences finish; every batch has its own lengths), and oneDNN's linear kernel allocates outputs
and scratchpads of those sizes. glibc serves a block above its mmap threshold with a mapping of its
own, returned whole when freed, but it raises the threshold to the size of every such block freed,
up to 32 MiB: from then on those tensors come from the heap, which keeps the space they free. Sizes
that rarely repeat leave the heap full of free holes, so the peak RSS of ``evaluate.py input=FILE``
grew with the file's length (docs/benchmarks.md#translating-a-long-file-memory). A threshold set by
``mallopt`` is never raised.
"""

from __future__ import annotations

import ctypes
import logging

log = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3  # glibc's malloc.h
MMAP_THRESHOLD = 1 << 20  # bytes: larger blocks are mapped for themselves, and unmapped when freed


def fix_mmap_threshold(size: int = MMAP_THRESHOLD) -> bool:
    """Set glibc's mmap threshold to ``size`` bytes for the rest of the process; False where the
    C library is not glibc (nothing changes)."""
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # another C library (macOS, musl)
        return False
    done = bool(mallopt(M_MMAP_THRESHOLD, size))
    log.debug("mallopt(M_MMAP_THRESHOLD, %d): %s", size, done)
    return done
