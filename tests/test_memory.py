"""The freed memory of an answer goes back to the OS once the engine is idle (runtime/memory.py)."""

from __future__ import annotations

import ctypes
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


def _in_heap(address: int) -> bool:
    for line in Path("/proc/self/maps").read_text().splitlines():
        span, *rest = line.split()
        low, high = (int(part, 16) for part in span.split("-"))
        if low <= address < high:
            return rest[-1] == "[heap]" if len(rest) >= 5 else False
    raise RuntimeError(f"{address:#x} is in no mapping")


@pytest.mark.skipif(NO_TRIM, reason="needs glibc")
def test_the_kv_caches_buffers_are_mappings_of_their_own_resident_only_where_written():
    """A KV cache buffer (2 MiB here, under the 32 MiB threshold a load leaves) is not a heap block, which may be
    resident whole already: its pages come in as positions are written."""
    import torch

    from localspec.runtime.static_cache import PreallocatedLayer

    with memory.load_allocations():  # the allocator as a model's load leaves it: 2 MiB blocks would be heap blocks
        pass
    template = torch.empty((1, 16, 0, 64), dtype=torch.bfloat16)
    before = rss_kib()
    layers = [PreallocatedLayer(1024, 4096) for _ in range(8)]  # 8 × 2 × 2 MiB
    for layer in layers:
        layer.append_in_place(4, template)
        layer.keys[:, :, :4] = 1.0
        layer.values[:, :, :4] = 1.0
    assert not any(_in_heap(layer.keys.data_ptr()) or _in_heap(layer.values.data_ptr()) for layer in layers)
    grown = rss_kib() - before
    assert grown < 8 * 2 * 2048 / 4, f"{grown} KiB resident for 4 of 1,024 positions written"


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
