"""How well the controllers' forecast matched: per answer, its forecast speedup (StatsSnapshot.answer_forecast: the
steps' forecasts weighted by their tokens, with the prefill) ÷ the speedup measured against the `none` mode on the
same prompt (both modes ran interleaved), for answers long enough to judge (MIN_TOKENS)."""

from __future__ import annotations

import statistics

MIN_TOKENS = 64  # shorter answers are mostly prefill and warm-up: their measured speedup says little
WITHIN = (0.8, 1.25)  # the issue's goal: 90 % of answers' forecast ÷ measured in this band


def forecast_ratios(records, mode_label: str, none_label: str) -> list[float]:
    """forecast ÷ measured for each answer of `mode_label` with a forecast, ≥ MIN_TOKENS tokens, and a none run."""
    ratios = []
    for record in records:
        spec, base = record.results.get(mode_label), record.results.get(none_label)
        if spec is None or base is None or spec.stats is None or spec.stats.answer_forecast is None:
            continue
        if len(spec.token_ids) < MIN_TOKENS or not spec.seconds or not base.seconds or not base.token_ids:
            continue
        measured = (len(spec.token_ids) / spec.seconds) / (len(base.token_ids) / base.seconds)
        ratios.append(spec.stats.answer_forecast / measured)
    return ratios


def distribution(ratios: list[float]) -> dict | None:
    """The ratios' spread: count, median, 10th and 90th percentile, and the share within WITHIN; None when empty."""
    if not ratios:
        return None
    ordered = sorted(ratios)
    pick = lambda q: ordered[min(int(q * len(ordered)), len(ordered) - 1)]  # noqa: E731
    low, high = WITHIN
    return {
        "answers": len(ordered),
        "median": statistics.median(ordered),
        "p10": pick(0.1),
        "p90": pick(0.9),
        "within": sum(low <= r <= high for r in ordered) / len(ordered),
    }


def forecast_check(records, modes) -> dict[str, dict]:
    """mode label → the distribution of its answers' forecast ÷ measured speedup (modes with a forecast only)."""
    none_label = next((m.label for m in modes if m.name == "none"), None)
    if none_label is None:
        return {}
    found = {}
    for mode in modes:
        spread = distribution(forecast_ratios(records, mode.label, none_label))
        if spread is not None and mode.label != none_label:
            found[mode.label] = spread
    return found


def to_markdown(check: dict[str, dict]) -> list[str]:
    if not check:
        return []
    low, high = WITHIN
    lines = [
        "## Forecast ÷ measured speedup",
        "",
        f"Per answer of ≥ {MIN_TOKENS} tokens: the controllers' forecast of the answer (each step's, weighted by its "
        f"tokens, plain steps at 1×, the prefill on both sides) ÷ the speedup measured against `none` on the same "
        f"prompt (1.00 = exact). Goal: 90 % within {low}–{high}.",
        "",
        "| mode | answers | median | 10th pct | 90th pct | within |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for label, s in check.items():
        lines.append(
            f"| {label} | {s['answers']} | {s['median']:.2f} | {s['p10']:.2f} | {s['p90']:.2f} | {s['within']:.0%} |"
        )
    return lines + [""]
