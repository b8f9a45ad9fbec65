"""`localspec bench --repeat N`: the whole interleaved set N times, and per mode the median of the runs' ratios with
their spread (lowest–highest), so a figure is not one run's luck on a shared machine."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from .report import ALL, summarize
from .runner import BenchRun

MEASURES = ("tokens_per_s", "speedup_vs_hf", "speedup_vs_none")


@dataclass(frozen=True)
class Spread:
    median: float
    low: float
    high: float
    runs: int

    def text(self, spec: str = ".2f") -> str:
        return f"{self.median:{spec}} ({self.low:{spec}}–{self.high:{spec}})"


def spread(values: list[float]) -> Spread | None:
    values = [v for v in values if v is not None]
    if not values:
        return None
    return Spread(statistics.median(values), min(values), max(values), len(values))


def combine(runs: list[BenchRun]) -> dict:
    """label → category → measure → Spread (None where a run had no reference mode)."""
    summaries = [summarize(run) for run in runs]
    out: dict[str, dict[str, dict[str, Spread | None]]] = {}
    for label, by_category in summaries[0]["rows"].items():
        out[label] = {
            category: {m: spread([s["rows"][label][category].get(m) for s in summaries]) for m in MEASURES}
            for category in by_category
        }
    return out


def to_markdown(combined: dict, runs: int) -> str:
    lines = [
        f"Median of {runs} interleaved runs (lowest–highest):",
        "",
        "| mode | tok/s | × hf | × none | slowest category × none |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for label, by_category in combined.items():
        whole = by_category[ALL]
        per_category = {c: v["speedup_vs_none"] for c, v in by_category.items() if c != ALL and v["speedup_vs_none"]}
        slowest = min(per_category, key=lambda c: per_category[c].median) if per_category else None
        cells = [
            whole["tokens_per_s"].text(".1f") if whole["tokens_per_s"] else "–",
            whole["speedup_vs_hf"].text() if whole["speedup_vs_hf"] else "–",
            whole["speedup_vs_none"].text() if whole["speedup_vs_none"] else "–",
            f"{per_category[slowest].text()} ({slowest})" if slowest else "–",
        ]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def to_json(combined: dict) -> dict:
    return {
        label: {
            category: {m: (vars(s) if s is not None else None) for m, s in measures.items()}
            for category, measures in by_category.items()
        }
        for label, by_category in combined.items()
    }
