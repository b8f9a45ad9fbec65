"""Interleaved timing for the measurement commands (`localspec bench kernels`, `localspec bench rounding`'s tables):
every candidate is called in turn, round after round, after warm-up rounds whose times are dropped, so that a change
in the machine's load (2 shared cores) lands on all candidates alike; then medians and a markdown table."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence


def interleave(
    calls: Mapping[str, Callable[[], object]],
    repeats: int,
    warmup: int = 3,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, list[float]]:
    """Seconds per call of each candidate over `repeats` rounds; each round calls every candidate once, in order,
    after `warmup` rounds that are not kept."""
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats must be ≥ 1 and warmup ≥ 0 (got {repeats}, {warmup})")
    times: dict[str, list[float]] = {name: [] for name in calls}
    for round_ in range(warmup + repeats):
        for name, call in calls.items():
            started = clock()
            call()
            elapsed = clock() - started
            if round_ >= warmup:
                times[name].append(elapsed)
    return times


def medians(times: Mapping[str, Sequence[float]], scale: float = 1e3) -> dict[str, float]:
    """Each candidate's median, times `scale` (1e3: milliseconds from seconds)."""
    return {name: statistics.median(values) * scale for name, values in times.items()}


def ratio(numerator: float, denominator: float) -> str:
    return f"{numerator / denominator:.2f}" if denominator > 0 else "–"


def table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A markdown table; the first column left-aligned, the others right-aligned (figures)."""
    header = list(header)
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    for row in rows:
        if len(row) != len(header):
            raise ValueError(f"a row of {len(row)} cells under {len(header)} columns: {list(row)}")
        lines.append("| " + " | ".join(str(cell) for cell in row) + " |")
    return "\n".join(lines)
