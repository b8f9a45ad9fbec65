"""Background load beside a bench (`localspec bench --background-load N`): N busy processes, so "never slower than
plain decoding" is measured where a desktop user lives (a browser, an IDE), not only on an idle machine.

Each process spins on integer arithmetic and ends by itself: when the bench sets the stop event (the `with` block
ends, normally or by an exception), when its parent is gone (it checks every tenth of a second, so a bench killed
outright leaves no orphan), and, as a last bound, after `max_s` seconds.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

from localspec.config import ConfigError

MAX_S = 24 * 3600.0  # no load process outlives a day, whatever happens to the bench


def _spin(stop, parent: int, max_s: float) -> None:
    """Busy work until told to stop, orphaned, or max_s passed."""
    ends = time.monotonic() + max_s
    while not stop.is_set() and os.getppid() == parent and time.monotonic() < ends:
        deadline = time.monotonic() + 0.1
        x = 0
        while time.monotonic() < deadline:
            for i in range(2000):
                x = (x * 31 + i) & 0xFFFF


def check_load(n: int) -> None:
    cores = os.cpu_count() or 1
    if not 0 <= n <= cores:
        raise ConfigError(f"--background-load must be between 0 and the {cores} CPUs of this machine (got {n})")


@contextmanager
def background_load(n: int, max_s: float = MAX_S) -> Iterator[list[int]]:
    """Run n busy processes for the duration of the block; yields their pids. n 0: nothing runs."""
    check_load(n)
    context = multiprocessing.get_context("fork")
    stop = context.Event()
    workers = [context.Process(target=_spin, args=(stop, os.getpid(), max_s), daemon=True) for _ in range(n)]
    for worker in workers:
        worker.start()
    try:
        yield [worker.pid for worker in workers]
    finally:
        stop.set()
        for worker in workers:
            worker.join(timeout=2.0)
            if worker.is_alive():
                worker.terminate()
                worker.join(timeout=2.0)
