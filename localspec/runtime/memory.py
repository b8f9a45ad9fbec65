"""Handing the memory an answer freed back to the operating system once the engine is idle.

glibc's malloc keeps the blocks a forward frees (activations, logits, the proposers' tensors) in its heaps for reuse,
and raises its mmap threshold to the largest block freed so far, so those blocks stay in the heap too. A chat app
that runs for days then holds tens of MB more or less from one answer to the next, depending on which blocks happen
to sit at the top of a heap, and never gives them back. A fixed low mmap threshold would return each block at once,
but every step's large tensors would then fault in fresh pages (slower decoding); trimming once when the engine goes
idle costs nothing per step.
"""

from __future__ import annotations

import ctypes
import functools
import sys


@functools.cache
def _malloc_trim():
    """glibc's malloc_trim, or None where the C library has none (macOS, Windows, musl)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def release_free_memory() -> bool:
    """Return the free pages of every malloc arena to the OS (True when the allocator could do it)."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
