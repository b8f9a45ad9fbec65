"""One token as a span: its kind class, its provenance card (data-tip, shown by assets/transcript.js), its text.

The one place the token markup is written: render.tokens_html and markdown.py both call token_span.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any, Optional

from localspec.engine.events import TOKEN_KINDS, TokenEvent

KIND_LABELS = {
    "accepted": "accepted draft token",
    "resampled": "resampled by the target (draft token rejected)",
    "bonus": "bonus token (all drafts accepted)",
    "target": "target token (speculation off)",
}
_TEMPLATE_CHARS = str.maketrans({"{": "&#123;", "}": "&#125;", "$": "&#36;", "`": "&#96;", "@": "&#64;"})


def escape(text: Any) -> str:
    """HTML-escape any text (quotes included) and neutralise template syntax ({ } $ ` @)."""
    return html.escape(str(text), quote=True).translate(_TEMPLATE_CHARS)


def token_record(token: TokenEvent, decode: Optional[Callable[[list[int]], str]] = None) -> dict:
    """A TokenEvent as a plain dict (what the UI state and the store keep), with the rejected draft token's text."""
    record = token.to_dict()
    record["acceptance_prob"] = token.acceptance_prob
    record["rejected_text"] = None
    if token.rejected_token_id is not None and decode is not None:
        try:
            record["rejected_text"] = decode([token.rejected_token_id])
        except Exception:  # a tokenizer that cannot decode one id alone: the id is still shown
            record["rejected_text"] = None
    return record


def _prob(value: Optional[float]) -> str:
    return "—" if value is None else f"{value:.3f}"


def token_title(record: dict, greedy: bool = False) -> str:
    """The provenance card of one token (plain text, one fact a line; escaped by the caller).

    greedy: the answer ran at temperature 0, where a draft token is kept exactly when it is the target's top token;
    the card then says so instead of quoting an acceptance probability that played no part."""
    kind = record.get("kind", "target")
    lines = [KIND_LABELS.get(kind, kind), f"p_target = {_prob(record.get('p_target'))}"]
    if record.get("text") is not None:  # the whole token, also where markdown shows a part of it
        ident = record.get("id")
        lines.insert(0, f"token {record['text']!r}" + (f" (id {ident})" if ident is not None else ""))
    if kind == "accepted":
        lines.append(f"p_draft = {_prob(record.get('p_draft'))}")
        if greedy:
            lines.append("accepted: the draft token is the target's top token")
        else:
            lines.append(f"acceptance min(1, p_target/p_draft) = {_prob(record.get('acceptance_prob'))}")
        if record.get("branch"):
            lines.append(f"branch {record['branch']} of the token tree (0 = the proposer's first choice)")
    elif kind == "resampled":
        rejected = record.get("rejected_text")
        shown = repr(rejected) if rejected is not None else f"id {record.get('rejected_id')}"
        lines.append(
            f"rejected draft token {shown}: p_target = {_prob(record.get('rejected_p_target'))}, "
            f"p_draft = {_prob(record.get('rejected_p_draft'))}"
        )
        if greedy:
            lines.append("rejected: the target's top token differs")
        else:
            lines.append(f"acceptance min(1, p_target/p_draft) = {_prob(record.get('acceptance_prob'))}")
    return "\n".join(lines)


def token_span(
    record: dict, colour: bool = True, text: Optional[str] = None, greedy: bool = False, inner: Optional[str] = None
) -> str:
    """The span of one token (or of the part `text` of it that one piece of markdown rendered). inner: that text
    already as HTML (escaped, with its syntax colours), in place of the escaped text."""
    kind = record.get("kind") if record.get("kind") in TOKEN_KINDS else "target"
    shown = record.get("text", "") if text is None else text
    classes = f"tok tok-{kind}" + ("" if colour else " tok-plain") + ("" if shown.strip() else " tok-space")
    body = escape(shown) if inner is None else inner
    return f'<span class="{classes}" tabindex="-1" data-tip="{escape(token_title(record, greedy))}">{body}</span>'
