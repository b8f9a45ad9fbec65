"""The forwards' thread count, following what the machine's other processes leave free.

torch's threads, and the kernels' (which take torch's count), meet at a barrier after every operation, so a core
another process keeps busy holds every forward back: beside one busy process on 2 cores, 2 threads decoded the
evaluation prompts at 33 tok/s and 1 thread at 94 (Zen 4 EPYC, 2026-12-08). The kernels' forwards are the same bits
at any thread count (each output summed by one thread in one order), so where every forward runs on them the count
may change between forwards without changing an answer; runtime/plan.py says where (`threads`).

Words:
- others' cores: the cores the other processes kept busy since the last reading: (the machine's busy CPU time −
  this process's CPU time) / the wall time between the readings, from /proc/stat and os.times().
- free cores: the cores this process may use (its affinity) minus others' cores; the count is the configured one,
  lowered to the free cores rounded (at least 1), read again every INTERVAL_S.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from typing import Optional

INTERVAL_S = 0.5  # seconds between readings: a step is ~5 ms, so a reading costs nothing next to what it decides
STAT = "/proc/stat"


def cpu_seconds() -> Optional[tuple[float, float]]:
    """(the machine's busy CPU seconds since boot, this process's CPU seconds); None where /proc/stat is not there."""
    try:
        with open(STAT, encoding="ascii") as stat:
            fields = stat.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu" or len(fields) < 8:
        return None
    # user nice system idle iowait irq softirq steal ...: busy is all but idle and iowait
    ticks = [int(value) for value in fields[1:9]]
    busy = sum(ticks) - ticks[3] - ticks[4]
    mine = os.times()
    return busy / os.sysconf("SC_CLK_TCK"), mine.user + mine.system


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class ThreadGovernor:
    """The thread count for the next forward: `configured` while the machine is otherwise idle, fewer while other
    processes keep cores busy (see the module's words)."""

    def __init__(
        self,
        configured: int,
        cores: Optional[int] = None,
        read: Callable[[], Optional[tuple[float, float]]] = cpu_seconds,
        clock: Callable[[], float] = time.monotonic,
        interval_s: float = INTERVAL_S,
    ) -> None:
        self.configured = max(1, configured)
        self.cores = usable_cores() if cores is None else cores
        self.read, self.clock, self.interval_s = read, clock, interval_s
        self.count = self.configured
        self._last: Optional[tuple[float, float, float]] = None  # (wall, busy, mine) at the last reading

    def threads(self) -> int:
        now = self.clock()
        if self._last is not None and now - self._last[0] < self.interval_s:
            return self.count
        reading = self.read()
        if reading is None:
            return self.count
        if self._last is not None:
            wall, busy, mine = self._last
            others = max(0.0, (reading[0] - busy) - (reading[1] - mine)) / max(now - wall, 1e-9)
            self.count = max(1, min(self.configured, math.floor(self.cores - others + 0.5)))
        self._last = (now, *reading)
        return self.count
