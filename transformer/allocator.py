"""A CPU process's memory, set for each workflow: oneDNN's kernel caches, and glibc's heap.

PyTorch's CPU matrix products (bf16 ones, and this package's float32 linear layers:
:mod:`transformer.linear`) compile a oneDNN kernel for each new shape and keep it in two caches,
oneDNN's own and ideep's (PyTorch's wrapper around it), of 1024 kernels each. Token-budget batches
have a new shape at almost every training step, and decoding's batches at almost every step of the
search (a batch's rows shrink as its sentences finish), so both caches filled with kernels of
shapes that never come back: long-lived blocks among a step's short-lived ones, which left glibc's
heap full of holes it could not give back, and a process's peak RSS growing with the steps it ran
(a training run's, and that of ``evaluate.py input=FILE`` with the file's length).
:func:`bound_kernel_caches`, which training and decoding call, keeps 64 in each, more than a step
uses (docs/benchmarks.md#onednns-kernel-caches-in-cpu-training-2026-12-02,
docs/benchmarks.md#onednns-kernel-caches-in-decoding-2026-12-02).

glibc serves a block above its mmap threshold with a mapping of its own, returned whole when freed,
but it raises the threshold to the size of every such block freed, up to 32 MiB; and it gives the
top of its heap back to the kernel whenever more than its trim threshold lies free there (twice the
mmap threshold once that moved). A block the kernel gets back costs a page fault per 4 KiB page the
next time it is written. Thresholds set by ``mallopt`` are never moved. A CPU training step
allocates and frees the same few hundred tensors at every step, the loss's chunks of logits (16 MB
of float32) among them. With glibc's defaults much of that was given back and faulted in again at
every step (10,000-16,000 pages a step at the CPU recipe's size): :func:`keep_freed_memory` keeps
what a step frees for the next, as PyTorch's own allocator keeps a GPU's
(docs/benchmarks.md#glibcs-heap-in-cpu-training-2026-12-02). Decoding keeps glibc's defaults.
"""

from __future__ import annotations

import ctypes
import logging
import os

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1  # glibc's malloc.h
M_MMAP_THRESHOLD = -3
TRAINING_MMAP_THRESHOLD = 32 << 20  # the most glibc takes: blocks up to it come from the heap
TRAINING_TRIM_THRESHOLD = 1 << 30  # the heap's top is given back once this much of it lies free
KERNEL_CACHE_CAPACITY = 64  # kernels in each: a step of the CPU recipe multiplies about 30 shapes
KERNEL_CACHES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")  # oneDNN's, ideep's


def _mallopt(param: int, value: int) -> bool:
    """glibc's ``mallopt(param, value)``; False where the C library is not glibc (macOS, musl) or
    glibc refuses the value."""
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    done = bool(mallopt(param, value))
    log.debug("mallopt(%d, %d): %s", param, value, done)
    return done


def keep_freed_memory() -> bool:
    """For a training process on CPU: blocks up to 32 MiB from the heap, and the heap's free top
    kept up to 1 GiB, for the rest of the process; False where the C library is not glibc."""
    return _mallopt(M_MMAP_THRESHOLD, TRAINING_MMAP_THRESHOLD) and _mallopt(
        M_TRIM_THRESHOLD, TRAINING_TRIM_THRESHOLD
    )


def bound_kernel_caches(capacity: int = KERNEL_CACHE_CAPACITY) -> None:
    """Keep at most ``capacity`` oneDNN kernels in each of PyTorch's CPU kernel caches, where the
    process has not set their variables itself. Both caches read them when first used, so this
    takes effect only before the process's first CPU matrix product."""
    for variable in KERNEL_CACHES:
        os.environ.setdefault(variable, str(capacity))
