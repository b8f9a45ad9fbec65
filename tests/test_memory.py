"""The freed memory of an answer goes back to the OS once the engine is idle (runtime/memory.py)."""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

import pytest

from localspec.runtime import memory
from localspec.server.admission import Admission

BLOCK = 64 << 10  # under glibc's default mmap threshold: these live in the heap
BLOCKS = 2000  # 125 MiB


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


NO_TRIM = not sys.platform.startswith("linux") or memory._libc("malloc_trim", (ctypes.c_size_t,)) is None


@pytest.mark.skipif(NO_TRIM, reason="needs glibc")
def test_freed_heap_blocks_go_back_to_the_os():
    blocks = [bytearray(BLOCK) for _ in range(BLOCKS)]  # bytearray writes its zeros: every page is resident
    pinned = bytearray(BLOCK)  # allocated last, at the top of the heap: free() alone cannot shrink the heap past it
    del blocks
    held = rss_kib()
    assert memory.release_free_memory()
    released = held - rss_kib()
    assert released > BLOCKS * BLOCK / 1024 / 2, f"only {released} KiB of {BLOCKS * BLOCK >> 10} KiB went back"
    del pinned


def _resident_pages(address: int, size: int) -> int:
    """Pages of [address, address + size) in memory now (mincore)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    page = os.sysconf("SC_PAGE_SIZE")
    start = address // page * page
    length = address + size - start
    flags = (ctypes.c_ubyte * ((length + page - 1) // page))()
    if libc.mincore(start, length, flags):
        raise OSError(ctypes.get_errno(), "mincore")
    return sum(flag & 1 for flag in flags)


@pytest.mark.skipif(NO_TRIM, reason="needs glibc")
def test_the_kv_caches_buffers_are_resident_only_where_written():
    """A KV cache buffer (2 MiB here) comes with none of its pages in memory, even where the heap holds freed memory
    still resident that the allocator would hand back: its pages come in as positions are written. A zeroed buffer,
    or one made of that freed memory, fails this."""
    import torch

    from localspec.runtime.static_cache import PreallocatedLayer

    with memory.load_allocations():  # the allocator as a model's load leaves it (heap blocks up to 32 MiB)
        pass
    freed = [torch.ones(8 << 20, dtype=torch.uint8) for _ in range(6)]  # 48 MiB of heap, every page written
    del freed  # free, and still resident: what a forward leaves in the heap
    heads, positions, dim = 16, 1024, 64  # a head's rows: 1,024 × 128 bytes = 32 pages
    template = torch.empty((1, heads, 0, dim), dtype=torch.bfloat16)
    layers = [PreallocatedLayer(positions, 4096) for _ in range(8)]
    for layer in layers:
        layer.append_in_place(4, template)
        layer.keys[:, :, :4] = 1.0  # the first page of each head's rows
        layer.values[:, :, :4] = 1.0
    for layer in layers:
        for buffer in (layer.keys, layer.values):
            resident = _resident_pages(buffer.data_ptr(), buffer.numel() * buffer.element_size())
            # a head's 4 written rows (512 bytes) may straddle two pages, and the buffer's first and last pages may
            # be shared with other blocks of the heap
            assert resident <= 2 * heads + 2, f"{resident} pages resident for {heads} written ({heads * 32} in all)"


def test_the_engine_going_idle_releases_memory_and_a_busy_one_does_not(monkeypatch):
    calls = []
    monkeypatch.setattr("localspec.server.admission.release_free_memory", lambda: calls.append(1))
    admission = Admission()
    first, second = admission.enter("chat"), admission.enter("api")
    assert admission.wait(first, timeout=1)
    admission.leave(first)  # the second is waiting: the engine is not idle
    assert calls == []
    assert admission.wait(second, timeout=1)
    admission.leave(second)
    assert calls == [1]
    admission.leave(second)  # twice: nothing more to release
    assert calls == [1]
    with admission:  # a pair load that freed the old pair
        pass
    assert calls == [1, 1]
