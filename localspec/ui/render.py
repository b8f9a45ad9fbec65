"""Events → HTML. Token spans coloured by kind, the legend, the stats panel and the per-position acceptance chart.

Everything here is a pure function of records the engine produced (TokenEvent / StatsSnapshot, or their dict
forms as stored with a conversation). Model text and titles are always escaped: an answer holding `<script>` shows
as text. Braces and dollar signs are escaped too, so no template engine downstream can read model text as a template.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Optional

from localspec.engine.events import TOKEN_KINDS, StatsSnapshot
from localspec.engine.metrics import PauseReason

from .markdown import answer_markdown_html, plain_markdown_html
from .settings import shape_label
from .spans import KIND_LABELS, escape, token_record, token_span, token_title  # noqa: F401 (the render API)


def tokens_html(records: Iterable[dict], colour: bool = True) -> str:
    return "".join(token_span(r, colour) for r in records if r.get("text"))


def legend_html() -> str:
    items = "".join(
        f'<span class="tok tok-{kind}" title="{escape(KIND_LABELS[kind])}">{kind}</span>' for kind in TOKEN_KINDS
    )
    return (
        f'<div class="ls-legend">{items}<span class="ls-legend-hint">hover a token for its probabilities</span></div>'
    )


def _message_html(turn: dict, colour: bool) -> str:
    role = turn.get("role", "user")
    if role == "assistant":
        tokens = turn.get("tokens")
        body = answer_markdown_html(tokens, colour) if tokens else plain_markdown_html(turn.get("content", ""))
        note = ""
        reason = turn.get("finish_reason")
        if turn.get("pending"):
            body += '<span class="ls-cursor">▍</span>'
        elif reason == "cancelled":
            note = '<div class="ls-note">stopped — partial answer kept</div>'
        elif reason == "error":
            note = f'<div class="ls-note ls-error">{escape(turn.get("error") or "the answer failed")}</div>'
        elif reason == "incomplete":
            note = '<div class="ls-note">incomplete — the app stopped during this answer</div>'
        meta = turn.get("label")
        head = f'<div class="ls-meta">{escape(meta)}</div>' if meta else ""
        tools = "" if turn.get("pending") or not turn.get("content") else copy_markdown_html(turn["content"])
        return f'<div class="ls-msg ls-assistant">{head}<div class="ls-body ls-md">{body}</div>{tools}{note}</div>'
    return f'<div class="ls-msg ls-{escape(role)}"><div class="ls-body">{escape(turn.get("content", ""))}</div></div>'


def copy_markdown_html(content: str) -> str:
    """The answer's markdown source (hidden) and a button that copies it (assets/transcript.js)."""
    return (
        f'<div class="ls-tools"><button type="button" class="ls-copy-md" title="copy the answer as markdown">'
        f'copy markdown</button><pre class="ls-raw" hidden>{escape(content)}</pre></div>'
    )


def transcript_html(turns: list[dict], colour: bool = True, notice: Optional[str] = None) -> str:
    """The whole conversation: user text escaped, assistant answers as token spans."""
    if not turns:
        inner = '<div class="ls-empty">Type a message below. Tokens are coloured by how they were made.</div>'
    else:
        inner = "".join(_message_html(t, colour) for t in turns if t.get("role") != "system")
    notice_html = f'<div class="ls-notice">{escape(notice)}</div>' if notice else ""
    return f'<div class="ls-transcript{"" if colour else " ls-nocolour"}">{inner}{notice_html}</div>'


def acceptance_chart_html(stats: StatsSnapshot) -> str:
    """Per-position acceptance P(accepted at draft position i) as horizontal bars."""
    data = stats.to_dict()
    rates = data.get("per_position_acceptance") or []
    drafted = data.get("per_position_drafted") or [0] * len(rates)
    if not rates or not any(drafted):
        return '<div class="ls-chart ls-chart-empty">per-position acceptance: no drafts yet</div>'
    rows = []
    for i, (rate, n) in enumerate(zip(rates, drafted)):
        width = max(0.0, min(1.0, rate)) * 100
        rows.append(
            f'<div class="ls-bar-row" title="position {i + 1}: {rate:.0%} of {n} drafts accepted">'
            f'<span class="ls-bar-label">{i + 1}</span><span class="ls-bar-track">'
            f'<span class="ls-bar" style="width:{width:.1f}%"></span></span>'
            f'<span class="ls-bar-value">{rate:.0%}</span></div>'
        )
    return f'<div class="ls-chart"><div class="ls-chart-title">acceptance by draft position</div>{"".join(rows)}</div>'


def pause_text(paused: PauseReason) -> str:
    """Why adaptive speculation is off, in the deciding controller's numbers."""
    k = paused.k
    return (
        f"speculation paused: drafting {k} token{'s' if k != 1 else ''} would cost {paused.cost:.2f}× "
        f"a plain step here and win only {paused.tokens:.2f}× (predicted speedup "
        f"{paused.speedup:.2f}×); retrying every {paused.probe_every} steps"
    )


def runtime_html(runtime: Optional[dict]) -> str:
    """Device, dtype, quantization and sampler kernel of the pair in use."""
    if not runtime:
        return ""
    parts = [
        runtime.get("device"),
        runtime.get("dtype"),
        None if runtime.get("quant") in (None, "none") else runtime.get("quant"),
        f"sampler {runtime['sampler']}" if runtime.get("sampler") else None,
    ]
    return f'<div class="ls-runtime">{escape(" · ".join(str(p) for p in parts if p))}</div>'


def stats_html(
    stats: Optional[StatsSnapshot],
    proposer: Optional[str] = None,
    k: Optional[int] = None,
    finish_reason: Optional[str] = None,
    runtime: Optional[dict] = None,
    tree_nodes: Optional[int] = None,
) -> str:
    """The live stats panel for the current answer; runtime: runtime.runtime_of(session) for the header; tree_nodes:
    the size of the token trees it drafted (the header then says "tree N" where a chain's says "K=k")."""
    if stats is None:
        return (
            '<div class="ls-stats ls-stats-empty">Stats of the current answer appear here while it streams.'
            f"{runtime_html(runtime)}</div>"
        )
    data = stats.to_dict()
    drafted, accepted = data.get("drafted", 0), data.get("accepted", 0)
    rate = data.get("acceptance_rate", 0.0)
    shape = shape_label(k, tree_nodes)
    head = (
        f'<div class="ls-stats-head">{escape(proposer or "")}{f" · {shape}" if shape else ""}'
        f"{f' · {escape(finish_reason)}' if finish_reason else ' · streaming…'}</div>"
    )
    rows = [
        ("accepted", f"Accepted {accepted}/{drafted} draft tokens ({rate:.0%})"),
        ("mean acceptance length", f"{data.get('mean_acceptance_length', 0.0):.2f} tokens / target forward"),
        ("tokens/s", f"{data.get('tokens_per_s', 0.0):.1f}"),
        ("tokens", f"{data.get('emitted', 0)}"),
        ("target forwards", f"{data.get('target_forwards', 0)}"),
    ]
    if data.get("predicted_speedup") is not None:
        rows.append(("predicted speedup", f"{data['predicted_speedup']:.2f}×"))
    table = "".join(
        f'<tr><th>{escape(name)}</th><td class="ls-stat-{i}">{escape(value)}</td></tr>'
        for i, (name, value) in enumerate(rows)
    )
    paused = f'<div class="ls-paused">{escape(pause_text(stats.paused))}</div>' if stats.paused else ""
    return (
        f'<div class="ls-stats">{head}{runtime_html(runtime)}{paused}<table class="ls-stats-table">{table}</table>'
        f"{timing_html(data)}{acceptance_chart_html(stats)}</div>"
    )


def timing_html(data: dict) -> str:
    """Step time split: propose / score (target forward) / sample, as a stacked bar with seconds."""
    parts = [
        ("propose", data.get("propose_s", 0.0)),
        ("score", data.get("score_s", 0.0)),
        ("sample", data.get("sampler_s", 0.0)),
    ]
    total = sum(v for _, v in parts)
    if total <= 0:
        return ""
    bar = "".join(
        f'<span class="ls-time ls-time-{name}" style="width:{v / total * 100:.1f}%" '
        f'title="{name}: {v * 1000:.0f} ms"></span>'
        for name, v in parts
    )
    text = " · ".join(f"{name} {seconds_text(v)} ({v / total:.0%})" for name, v in parts)
    prefill = data.get("prefill_s", 0.0)
    return (
        f'<div class="ls-timing"><div class="ls-chart-title">time per part of the step</div>'
        f'<div class="ls-time-bar">{bar}</div><div class="ls-time-text">{escape(text)}'
        f"{f' · prefill {seconds_text(prefill)}' if prefill else ''}</div></div>"
    )


def seconds_text(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 10 else f"{seconds:.1f} s"


def compare_html(
    spec_stats: dict | None,
    base_stats: dict | None,
    proposer: str = "",
    greedy: bool = True,
    identical: Optional[bool] = None,
    first_difference: Optional[int] = None,
) -> str:
    """Speculative vs baseline (proposer off) for the same prompt: both tokens/s, the speedup, same output?"""
    if not spec_stats or not base_stats:
        return ""
    spec_tps, base_tps = spec_stats.get("tokens_per_s", 0.0), base_stats.get("tokens_per_s", 0.0)
    speedup = f"{spec_tps / base_tps:.2f}×" if base_tps > 0 else "—"
    if not greedy:
        same = "sampled (temperature > 0): outputs follow the same distribution but need not be identical"
    elif identical:
        same = "greedy outputs are bitwise identical to plain decoding"
    elif first_difference is not None:
        same = (
            f"greedy outputs differ from token {first_difference + 1} (the verify forward rounds the logits "
            "differently from a 1-token forward; the exact forward setup removes this where measured)"
        )
    else:
        same = "greedy outputs differ"
    return (
        f'<div class="ls-compare"><div class="ls-chart-title">compare with baseline</div>'
        f'<table class="ls-stats-table"><tr><th>{escape(proposer or "speculative")}</th>'
        f'<td class="ls-compare-spec">{spec_tps:.1f} tok/s</td></tr>'
        f'<tr><th>baseline (off)</th><td class="ls-compare-base">{base_tps:.1f} tok/s</td></tr>'
        f'<tr><th>speedup</th><td class="ls-compare-speedup">{speedup}</td></tr></table>'
        f'<div class="ls-compare-same">{escape(same)}</div></div>'
    )


def status_html(message: str = "", level: str = "info") -> str:
    if not message:
        return '<div class="ls-status"></div>'
    return f'<div class="ls-status ls-status-{escape(level)}">{escape(message)}</div>'
