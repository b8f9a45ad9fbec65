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
from localspec.store.validation import finish_words

from .markdown import answer_markdown_html, plain_markdown_html
from .settings import shape_label
from .spans import KIND_LABELS, escape, token_record, token_span, token_title  # noqa: F401 (the render API)
from .versions import version_of


def tokens_html(records: Iterable[dict], colour: bool = True, greedy: bool = False) -> str:
    return "".join(token_span(r, colour, greedy=greedy) for r in records if r.get("text"))


def legend_html() -> str:
    """The key to the token styles (swatches in both styles) and how to read a token's provenance."""
    items = "".join(
        f'<span class="ls-key"><span class="ls-swatch ls-swatch-{kind}"></span>{escape(KIND_LABELS[kind])}</span>'
        for kind in TOKEN_KINDS
    )
    return (
        f'<div class="ls-legend">{items}<span class="ls-legend-hint">hover, tap or focus a token (arrow keys in an '
        "answer) for where it came from</span></div>"
    )


def is_greedy(turn: dict) -> bool:
    """The answer ran at temperature 0 (its saved sampling settings say so)."""
    sampling = turn.get("sampling") or {}
    return "temperature" in sampling and not sampling["temperature"]


def message_tools_html(turn: dict, index: int, idle: bool) -> str:
    """A message's version switch (‹ 2/3 ›, where it has versions) and, while nothing streams or is being edited, its
    Edit (a user message) or Regenerate (an answer) button; assets/transcript.js sends their clicks."""
    version, versions = version_of(turn)
    parts = []
    if versions > 1:
        earlier = "" if version > 1 and idle else " disabled"
        later = "" if version < versions and idle else " disabled"
        parts.append(
            f'<span class="ls-versions" role="group" aria-label="version {version} of {versions}">'
            f'<button type="button" class="ls-version-prev" data-ls-action="switch" data-index="{index}" '
            f'data-step="-1" aria-label="previous version"{earlier}>‹</button>'
            f'<span class="ls-version-count">{version}/{versions}</span>'
            f'<button type="button" class="ls-version-next" data-ls-action="switch" data-index="{index}" '
            f'data-step="1" aria-label="next version"{later}>›</button></span>'
        )
    if idle and turn.get("role") == "user":
        parts.append(
            f'<button type="button" class="ls-edit-msg" data-ls-action="edit" data-index="{index}" '
            'aria-label="edit this message">edit</button>'
        )
    elif idle and turn.get("role") == "assistant":
        parts.append(
            f'<button type="button" class="ls-regen-msg" data-ls-action="regenerate" data-index="{index}" '
            'aria-label="regenerate this answer (a new version)">regenerate</button>'
        )
    return f'<div class="ls-msg-tools">{"".join(parts)}</div>' if parts else ""


def _message_html(turn: dict, colour: bool, editing: bool = False, versions: str = "") -> str:
    role = turn.get("role", "user")
    mark = " ls-editing" if editing else ""
    if role == "assistant":
        tokens = turn.get("tokens")
        greedy = is_greedy(turn)
        body = answer_markdown_html(tokens, colour, greedy) if tokens else plain_markdown_html(turn.get("content", ""))
        note = ""
        reason = turn.get("finish_reason")
        if turn.get("pending"):
            body += '<span class="ls-cursor" aria-hidden="true">▍</span>'
        elif reason == "error":
            note = f'<div class="ls-note ls-error">{escape(turn.get("error") or "the answer failed")}</div>'
        elif reason and reason != "stop":
            note = f'<div class="ls-note">{escape(finish_words(reason))}</div>'
        meta = turn.get("label")
        head = f'<div class="ls-meta">{escape(meta)}</div>' if meta else ""
        tools = "" if turn.get("pending") or not turn.get("content") else copy_markdown_html(turn["content"])
        card = (
            ' tabindex="0" aria-label="answer; the arrow keys step through its tokens and show where each came from"'
            if tokens
            else ""
        )
        return (
            f'<div class="ls-msg ls-assistant{mark}">{head}<div class="ls-body ls-md"{card}>{body}</div>{tools}{note}'
            f"{versions}</div>"
        )
    text = escape(turn.get("content", ""))
    return f'<div class="ls-msg ls-{escape(role)}{mark}"><div class="ls-body">{text}</div>{versions}</div>'


def copy_markdown_html(content: str) -> str:
    """The answer's markdown source (hidden) and a button that copies it (assets/transcript.js)."""
    return (
        f'<div class="ls-tools"><button type="button" class="ls-copy-md" title="copy the answer as markdown">'
        f'copy markdown</button><pre class="ls-raw" hidden>{escape(content)}</pre></div>'
    )


EMPTY = "Type a message below. Each token of an answer is marked by how it was made."
EDIT_NOTE = (
    "Editing this message: change it in the box below and press Send to replace it and its answer with a new "
    "version (the old one stays, under ‹ ›), or Cancel edit."
)


def transcript_html(
    turns: list[dict], colour: bool = True, notice: Optional[str] = None, editing_from: Optional[int] = None
) -> str:
    """The whole conversation: user text escaped, assistant answers as token spans. colour: the full token colours
    (else the subtle underlines); editing_from: the index of the turn being edited (it and its answer stay in view,
    marked). Each message has its version switch and, while nothing streams or is edited, Edit or Regenerate."""
    if not turns:
        inner = f'<div class="ls-empty">{EMPTY}</div>'
    else:
        idle = editing_from is None and not any(t.get("pending") for t in turns)
        shown = [(i, t) for i, t in enumerate(turns) if t.get("role") != "system"]
        inner = "".join(
            _message_html(t, colour, editing_from is not None and i >= editing_from, message_tools_html(t, i, idle))
            for i, t in shown
        )
        if editing_from is not None:
            inner += f'<div class="ls-edit-note">{escape(EDIT_NOTE)}</div>'
    notice_html = f'<div class="ls-notice">{escape(notice)}</div>' if notice else ""
    return f'<div class="ls-transcript{"" if colour else " ls-subtle"}">{inner}{notice_html}</div>'


def acceptance_chart_html(stats: StatsSnapshot) -> str:
    """Per-position acceptance P(accepted at draft position i) as horizontal bars ("" before the first draft)."""
    data = stats.to_dict()
    rates = data.get("per_position_acceptance") or []
    drafted = data.get("per_position_drafted") or [0] * len(rates)
    if not rates or not any(drafted):
        return ""
    rows = []
    for i, (rate, n) in enumerate(zip(rates, drafted)):
        if not n:
            continue
        width = max(0.0, min(1.0, rate)) * 100
        rows.append(
            f'<div class="ls-bar-row" title="position {i + 1}: {rate:.0%} of {n} drafts accepted">'
            f'<span class="ls-bar-label">{i + 1}</span><span class="ls-bar-track">'
            f'<span class="ls-bar" style="width:{width:.1f}%"></span></span>'
            f'<span class="ls-bar-value">{rate:.0%}</span></div>'
        )
    title = "acceptance by draft position" + (" (depth in the tree)" if data.get("tree_nodes_drafted") else "")
    return f'<div class="ls-chart"><div class="ls-chart-title">{title}</div>{"".join(rows)}</div>'


def pause_text(paused: PauseReason, asked_k: Optional[int] = None) -> str:
    """Why adaptive K switched speculation off, in the user's units, from the deciding controller's numbers.
    asked_k: the K the user asked for (the controller measured the K it tried, which may be smaller)."""
    k = paused.k
    tried = f"{k} draft token{'s' if k != 1 else ''}"
    asked = f"You asked for K = {asked_k}; " if asked_k and asked_k != k else ""
    return (
        f"Speculation paused: a step with {tried} took {paused.cost:.2f}× as long as a plain step and "
        f"gave {paused.tokens:.2f} tokens on average, so it would run at "
        f"{paused.speedup:.2f}× the plain speed. {asked}the controller tried {tried} (its best K) and "
        f"retries every {paused.probe_every} steps."
    )


def paused_html(paused: PauseReason, asked_k: Optional[int] = None) -> str:
    """The pause note with its way out: a button that ticks "Keep speculating anyway" (assets/transcript.js)."""
    return (
        f'<div class="ls-paused">{escape(pause_text(paused, asked_k))} <button type="button" '
        'class="ls-keep-speculating" title="tick Keep speculating anyway in the settings: adaptive K off for the next '
        'answers">keep speculating anyway</button></div>'
    )


def runtime_html(runtime: Optional[dict]) -> str:
    """Device, dtype, quantization and sampler kernel of the pair in use (the load-time dtype timings in its title:
    they describe the load's probe, not this answer)."""
    if not runtime:
        return ""
    dtype = str(runtime.get("dtype") or "")
    name, _, why = dtype.partition(" (")
    parts = [
        runtime.get("device"),
        name or None,
        None if runtime.get("quant") in (None, "none") else runtime.get("quant"),
        f"sampler {runtime['sampler']}" if runtime.get("sampler") else None,
    ]
    title = f' title="dtype chosen at load: {escape(why.rstrip(")"))}"' if why else ""
    line = f'<div class="ls-runtime"{title}>{escape(" · ".join(str(p) for p in parts if p))}</div>'
    if not runtime.get("plan"):
        return line
    reasons = f' title="{escape(runtime["plan_reasons"])}"' if runtime.get("plan_reasons") else ""
    return line + f'<div class="ls-runtime ls-plan"{reasons}>plan {escape(runtime["plan"])}</div>'


# the one definition of each figure in the stats panel (the row's tooltip and the panel's help list)
DEFINITIONS: dict[str, str] = {
    "accepted draft tokens": "draft tokens the target kept, of those drafted (every drafted token of a chain counts)",
    "accepted depth": "path positions kept, of those drafted: per token-tree step, how deep the accepted path went "
    "against the tree's depth (siblings are counted on their own line)",
    "tree nodes drafted": "every node of every token tree drafted, siblings included",
    "tokens per forward": "tokens emitted per target forward (the bonus or resampled token included); 1.00 without "
    "speculation",
    "tokens/s": "tokens emitted per second of this answer, measured: its tokens over its whole time, prefill "
    "included (the time split below adds up to that time)",
    "time to first token": "seconds from the engine taking this answer to its first token: reading the prompt "
    "(prefill) and the first step, measured",
    "against plain decoding": "this answer's tokens per second of steps (propose + score + sample) against plain "
    "decoding's on this machine: the controller's running estimate of a plain step, measured on the steps it ran "
    "plain (a plain step now and then while speculating). Both leave out prefill and the time between steps",
    "tokens": "tokens of this answer",
    "target forwards": "forward passes of the target model for this answer (one per step)",
    "time per step": "propose + score + sample, per target forward, of this answer",
    "forecast speedup": "a forecast, not a measurement: the adaptive controller's expected speedup for its current "
    "K from its running estimates of acceptance and step costs, E / (K·c + v). The measured figures above are what "
    "happened; Compare with baseline measures the real speedup",
    "answer forecast": "a forecast, not a measurement: the controllers' forecast of this answer's speed against plain "
    "decoding of the same prompt, each step's forecast weighted by the tokens it emitted (a step that drafted "
    "nothing at 1×) with the prompt's reading on both sides; `localspec bench` checks it against the measured speedup",
}


def _row(name: str, value: str, index: int) -> str:
    tip = DEFINITIONS.get(name, "")
    return (
        f'<tr><th title="{escape(tip)}">{escape(name)}</th><td class="ls-stat-{index}" title="{escape(tip)}">'
        f"{escape(value)}</td></tr>"
    )


def stats_html(
    stats: Optional[StatsSnapshot],
    proposer: Optional[str] = None,
    k: Optional[int] = None,
    finish_reason: Optional[str] = None,
    runtime: Optional[dict] = None,
    tree_nodes: Optional[int] = None,
) -> str:
    """The live stats panel for the current answer; runtime: runtime.runtime_of(session) for the header; k None:
    the answer ran with speculation off (only the figures that apply show); tree_nodes: the size of the token trees
    it drafted (the header then says "tree N" where a chain's says "K=k")."""
    if stats is None:
        return (
            '<div class="ls-stats ls-stats-empty">Stats of the current answer appear here while it streams.'
            f"{runtime_html(runtime)}</div>"
        )
    data = stats.to_dict()
    drafting = k is not None
    shape = shape_label(k, tree_nodes) if drafting else "speculation off"
    head = (
        f'<div class="ls-stats-head">{escape(proposer or "")}{f" · {escape(shape)}" if shape else ""}'
        f"{f' · {escape(finish_words(finish_reason))}' if finish_reason else ' · streaming…'}</div>"
    )
    forwards = data.get("target_forwards", 0)
    step_s = sum(data.get(name, 0.0) for name in ("propose_s", "score_s", "sampler_s"))
    rows: list[tuple[str, str]] = []
    if drafting:
        drafted, accepted = data.get("drafted", 0), data.get("accepted", 0)
        rate = data.get("acceptance_rate", 0.0)
        nodes = data.get("tree_nodes_drafted", 0)
        if nodes:
            rows.append(("accepted depth", f"{accepted}/{drafted} ({rate:.0%})"))
            rows.append(("tree nodes drafted", f"{nodes}"))
        else:
            rows.append(("accepted draft tokens", f"{accepted}/{drafted} ({rate:.0%})"))
        rows.append(("tokens per forward", f"{data.get('mean_acceptance_length', 0.0):.2f}"))
    rows.append(("tokens/s", f"{data.get('tokens_per_s', 0.0):.1f}"))
    plain_tps, step_tps = data.get("plain_tokens_per_s"), data.get("step_tokens_per_s", 0.0)
    if drafting and plain_tps and step_tps:
        rows.append(
            (
                "against plain decoding",
                f"{step_tps / plain_tps:.2f}× ({step_tps:.1f} tok/s of steps; plain steps on this machine "
                f"{plain_tps:.1f} tok/s, the controller's running estimate)",
            )
        )
    if data.get("first_token_s") is not None:
        rows.append(("time to first token", seconds_text(data["first_token_s"])))
    rows += [("tokens", f"{data.get('emitted', 0)}"), ("target forwards", f"{forwards}")]
    if forwards and step_s > 0:
        rows.append(("time per step", seconds_text(step_s / forwards)))
    table = "".join(_row(name, value, i) for i, (name, value) in enumerate(rows))
    help_items = "".join(f"<li><b>{escape(name)}</b>: {escape(DEFINITIONS[name])}</li>" for name, _ in rows)
    if drafting and data.get("predicted_speedup") is not None:  # a forecast: explained, never in the measured table
        help_items += (
            f'<li class="ls-forecast"><b>controller\'s forecast</b>: {data["predicted_speedup"]:.2f}× — '
            f"{escape(DEFINITIONS['forecast speedup'])}</li>"
        )
    if drafting and data.get("answer_forecast") is not None:
        help_items += (
            f'<li class="ls-answer-forecast"><b>forecast for this answer</b>: {data["answer_forecast"]:.2f}× — '
            f"{escape(DEFINITIONS['answer forecast'])}</li>"
        )
    help_html = f'<details class="ls-help"><summary>what these figures mean</summary><ul>{help_items}</ul></details>'
    paused = ""
    if drafting and stats.paused:
        paused = paused_html(stats.paused, k)
    chart = acceptance_chart_html(stats) if drafting else ""
    return (
        f'<div class="ls-stats">{head}{runtime_html(runtime)}{paused}<table class="ls-stats-table">{table}</table>'
        f"{help_html}{timing_html(data)}{chart}</div>"
    )


def timing_html(data: dict) -> str:
    """The answer's time after prefill: propose / score (target forward) / sample / other (between steps), as a
    stacked bar with seconds; with prefill they add up to the time tokens/s divides by."""
    parts = [
        ("propose", data.get("propose_s", 0.0)),
        ("score", data.get("score_s", 0.0)),
        ("sample", data.get("sampler_s", 0.0)),
        ("other", data.get("other_s", 0.0)),  # between steps: the loop, the window, waiting for the engine
    ]
    if sum(v for _, v in parts[:3]) <= 0:
        return ""
    total = sum(v for _, v in parts)
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


COMPARE_REGION = 'tabindex="0" role="region" aria-label="compare with baseline"'  # it scrolls: the keyboard reaches it
NO_COMPARE = '<div class="ls-compare-none"></div>'  # the compare panel with nothing to show (Gradio keeps "")


def marked_text_html(texts: list[str], at: Optional[int]) -> str:
    """Token texts joined, escaped, with the token at index `at` (the first difference) marked."""
    if at is None or at >= len(texts):
        end = '<mark class="ls-diff">(ends here)</mark>' if at is not None else ""
        return escape("".join(texts)) + end
    return (
        f'{escape("".join(texts[:at]))}<mark class="ls-diff">{escape(texts[at]) or "·"}</mark>'
        f"{escape(''.join(texts[at + 1 :]))}"
    )


def compare_html(
    spec_stats: dict | None,
    base_stats: dict | None,
    proposer: str = "",
    greedy: bool = True,
    identical: Optional[bool] = None,
    first_difference: Optional[int] = None,
    spec_texts: Optional[list[str]] = None,
    base_texts: Optional[list[str]] = None,
    answer_index: Optional[int] = None,
    stopped: bool = False,
) -> str:
    """Speculative vs baseline (proposer off) for the same prompt: both tokens/s, the measured speedup (measured
    only: the controller's forecast is among the stats panel's explanations, labelled as one), same output?, and
    both texts side by side with the first difference marked.
    answer_index: which answer of the conversation this compares (0-based), so the panel says whose it is.
    stopped: one of the two was stopped early; `identical` then speaks of the tokens both have."""
    if not spec_stats or not base_stats:
        return ""
    spec_tps, base_tps = spec_stats.get("tokens_per_s", 0.0), base_stats.get("tokens_per_s", 0.0)
    speedup = f"{spec_tps / base_tps:.2f}×" if base_tps > 0 else "—"
    if not greedy:
        same = "sampled (temperature > 0): outputs follow the same distribution but need not be identical"
    elif identical and stopped:
        same = "one of the two answers was stopped early: the tokens both have are identical"
    elif identical:
        same = "greedy outputs are bitwise identical to plain decoding"
    elif first_difference is not None:
        same = (
            f"greedy outputs differ from token {first_difference + 1} (marked below: the verify forward rounds the "
            "logits differently from a 1-token forward; the exact forward setup removes this where measured)"
        )
    else:
        same = "greedy outputs differ"
    texts = ""
    if spec_texts is not None and base_texts is not None:
        at = None if identical else first_difference
        texts = (
            '<div class="ls-compare-texts">'
            f'<div class="ls-compare-col"><div class="ls-chart-title">{escape(proposer or "speculative")}</div>'
            f'<div class="ls-compare-text ls-compare-spec-text">{marked_text_html(spec_texts, at)}</div></div>'
            '<div class="ls-compare-col"><div class="ls-chart-title">baseline (speculation off)</div>'
            f'<div class="ls-compare-text ls-compare-base-text">{marked_text_html(base_texts, at)}</div></div></div>'
        )
    whose = f" of answer {answer_index + 1}" if answer_index is not None else ""
    return (
        f'<div class="ls-compare" {COMPARE_REGION}><div class="ls-chart-title">compare{whose} with baseline (the same '
        "prompt and "
        "settings, speculation off)</div>"
        f'<table class="ls-stats-table"><tr><th>{escape(proposer or "speculative")}</th>'
        f'<td class="ls-compare-spec">{spec_tps:.1f} tok/s</td></tr>'
        f'<tr><th>baseline (off)</th><td class="ls-compare-base">{base_tps:.1f} tok/s</td></tr>'
        f'<tr><th>measured speedup</th><td class="ls-compare-speedup">{speedup}</td></tr></table>'
        f'<div class="ls-compare-same">{escape(same)}</div>{texts}</div>'
    )


def compare_running_html(tokens: int) -> str:
    """The compare panel while the baseline streams: its count so far (the cursor marks a stream Stop can end)."""
    return (
        f'<div class="ls-compare ls-compare-running" {COMPARE_REGION}><div class="ls-chart-title">compare with '
        "baseline</div>"
        f"baseline (speculation off): {tokens} token{'s' if tokens != 1 else ''} so far"
        '<span class="ls-cursor" aria-hidden="true">▍</span></div>'
    )


def status_html(message: str = "", level: str = "info") -> str:
    if not message:
        return '<div class="ls-status"></div>'
    return f'<div class="ls-status ls-status-{escape(level)}">{escape(message)}</div>'
