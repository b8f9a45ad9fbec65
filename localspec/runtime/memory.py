"""Handing the memory an answer freed back to the operating system once the engine is idle.

glibc's malloc keeps the blocks a forward frees (activations, logits, the proposers' tensors) in its heaps for reuse,
and raises its mmap threshold to the largest block freed so far, so those blocks stay in the heap too. A chat app
that runs for days then holds tens of MB more or less from one answer to the next, depending on which blocks happen
to sit at the top of a heap, and never gives them back. A fixed low mmap threshold would return each block at once,
but every step's large tensors would then fault in fresh pages (slower decoding); trimming once when the engine goes
idle costs nothing per step.

A model's load is the opposite case: it packs one tensor after another, each through intermediates of tens of MB
(its blocks, codes, scales) freed before the next, between the packed buffers it keeps. With the dynamic threshold
those intermediates land in the heap between kept buffers, where a freed one is never returned (about 0.4 GB over a
1.7B-shaped file's load) and the next load's peak stacks on top. `load_allocations` fixes the threshold low for a
load, so each intermediate is its own mapping, unmapped when freed; after it the threshold is fixed at the dynamic
one's ceiling (where a large model's decoding had raised it anyway) with the trim threshold at twice that, as glibc
keeps them, and the heap is trimmed.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import sys


@functools.cache
def _libc(name: str, argtypes: tuple, restype=ctypes.c_int):
    """glibc's function `name`, or None where the C library has none (macOS, Windows, musl)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):
        return None
    function.argtypes = list(argtypes)
    function.restype = restype
    return function


def release_free_memory() -> bool:
    """Return the free pages of every malloc arena to the OS (True when the allocator could do it)."""
    trim = _libc("malloc_trim", (ctypes.c_size_t,))
    if trim is None:
        return False
    trim(0)
    return True


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt's parameters (malloc.h)
LOAD_MMAP_THRESHOLD = 128 << 10  # glibc's starting threshold: every block of a load from here up is its own mapping
MMAP_THRESHOLD_MAX = 32 << 20  # the dynamic threshold's ceiling on 64-bit glibc (DEFAULT_MMAP_THRESHOLD_MAX)


@contextlib.contextmanager
def load_allocations():
    """Within: blocks of LOAD_MMAP_THRESHOLD bytes and more are mappings of their own, returned when freed; after:
    the threshold at MMAP_THRESHOLD_MAX and the free heap trimmed (module docstring). Nothing where there is no
    mallopt."""
    mallopt = _libc("mallopt", (ctypes.c_int, ctypes.c_int))
    if mallopt is not None:
        mallopt(M_MMAP_THRESHOLD, LOAD_MMAP_THRESHOLD)
        mallopt(M_TRIM_THRESHOLD, LOAD_MMAP_THRESHOLD)
    release_free_memory()  # a block is mapped only where the heap has no room for it: leave the heap none
    try:
        yield
    finally:
        if mallopt is not None:
            mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX)
            mallopt(M_TRIM_THRESHOLD, 2 * MMAP_THRESHOLD_MAX)
        release_free_memory()
