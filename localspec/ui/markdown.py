"""An answer's markdown, rendered with every token's coloured span kept.

markdown-it-py parses the answer (the concatenated token texts) into a token stream; each piece of text it
renders (a text run, inline code, a code block's content) is located in the source, and its characters are split
at the answer's token boundaries into `<span class="tok tok-KIND">` with the token's hover card. A token that
spans markup (`**Eff`) colours only the text it produced. The parse decides the structure; the alignment only
decides colours, so a piece that cannot be located still shows its text (coloured as the token at that place).

Safety: raw HTML is off (it shows as text), every piece of text goes through render.escape (which also
neutralises template characters), links are kept only for http, https and mailto (opened in a new tab with
rel="noopener noreferrer"; any other link shows as its text), and images show as their alt text.

Streaming: the top-level blocks before the last one cannot change when text is appended (reference definitions,
the one markdown feature that reaches back, are off), so their HTML is cached per answer and each update parses
and renders only from the start of the last block.
"""

from __future__ import annotations

import operator
import re
from bisect import bisect_right
from collections import OrderedDict
from dataclasses import dataclass
from typing import Optional

from markdown_it import MarkdownIt

from .highlight import Mark, code_marks
from .spans import escape, token_span

LINK_SCHEMES = ("http://", "https://", "mailto:")
TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"  # structured/tools.py's format (Qwen2.5's, Hermes')
TOOL_NAME = re.compile(r'"name"\s*:\s*"((?:[^"\\]|\\.)*)"')  # read from a call still being written, too
SEARCH_WINDOW = 32  # how far a character that is not where expected is looked for (escapes, entities)
CACHE_ANSWERS = 256


def _tool_call_block(state, start: int, end: int, silent: bool) -> bool:
    """A block from a line that begins with <tool_call> to the line that ends with </tool_call> (to the end of the
    answer while it is still being written): one `tool_call` token whose content is the text between the tags. A
    call followed by other text on its closing line stays text, so nothing the model wrote is hidden."""
    if state.sCount[start] - state.blkIndent >= 4:
        return False
    first = state.bMarks[start] + state.tShift[start]
    if not state.src.startswith(TOOL_OPEN, first, state.eMarks[start]):
        return False
    if silent:
        return True
    last = start
    while last < end - 1 and state.src.find(TOOL_CLOSE, state.bMarks[last], state.eMarks[last]) < 0:
        last += 1
    block = state.src[first + len(TOOL_OPEN) : state.eMarks[last]]
    closed = block.find(TOOL_CLOSE)
    if closed >= 0 and block[closed + len(TOOL_CLOSE) :].strip():
        return False
    token = state.push("tool_call", "div", 0)
    token.content = block if closed < 0 else block[:closed]
    token.map = [start, last + 1]
    state.line = last + 1
    return True


def _parser() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": False, "breaks": True, "xhtmlOut": False})
    md.enable(["table", "strikethrough"]).disable(["reference", "html_block", "html_inline"])
    md.block.ruler.before("fence", "tool_call", _tool_call_block, {"alt": ["paragraph"]})
    return md


MD = _parser()


# -- locating rendered text in the source ----------------------------------------------------------------------
def _line_starts(text: str) -> list[int]:
    starts, at = [0], text.find("\n")
    while at >= 0:
        starts.append(at + 1)
        at = text.find("\n", at + 1)
    starts.append(len(text) + 1)
    return starts


class _Aligner:
    """Walks the source left to right; each rendered piece is found after the previous one, inside its block."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.lines = _line_starts(source)
        self.cursor = 0
        self.block_end = len(source)

    def enter(self, line_map: Optional[list[int]], top_level: bool) -> None:
        if not line_map:
            return
        start = self.lines[min(line_map[0], len(self.lines) - 1)]
        self.cursor = max(self.cursor, min(start, len(self.source)))
        if top_level:
            self.block_end = min(self.lines[min(line_map[1], len(self.lines) - 1)], len(self.source))

    def runs(self, piece: str) -> list[tuple[int, int, int]]:
        """(offset in piece, offset in source, length) runs covering the piece."""
        if not piece:
            return []
        source, end = self.source, max(self.block_end, self.cursor)
        found = source.find(piece, self.cursor, end)
        if found >= 0:
            self.cursor = found + len(piece)
            return [(0, found, len(piece))]
        runs: list[tuple[int, int, int]] = []
        for i, ch in enumerate(piece):
            limit = min(self.cursor + SEARCH_WINDOW, end)
            at = source.find(ch, self.cursor, limit)
            if at < 0 and ch == " ":  # inline code turns line ends into spaces
                at = source.find("\n", self.cursor, limit)
            if at < 0:  # an entity or a decoded character: the token at this place made it
                at = min(max(self.cursor - 1, 0), max(len(source) - 1, 0))
            else:
                self.cursor = at + 1
            if runs and runs[-1][1] + runs[-1][2] == at and runs[-1][0] + runs[-1][2] == i:
                runs[-1] = (runs[-1][0], runs[-1][1], runs[-1][2] + 1)
            else:
                runs.append((i, at, 1))
        return runs


def _align(tokens, aligner: _Aligner) -> None:
    """Store in each text-bearing token's meta the source runs of its rendered text."""
    for token in tokens:
        aligner.enter(token.map, token.level == 0 and token.nesting >= 0)
        if token.type == "inline":
            _align_inline(token.children or [], aligner)
        elif token.type in ("fence", "code_block", "tool_call"):
            token.meta["runs"] = aligner.runs(token.content)


def _align_inline(children, aligner: _Aligner) -> None:
    for child in children:
        if child.type in ("text", "code_inline"):
            child.meta["runs"] = aligner.runs(child.content)
        elif child.type == "image":
            _align_inline(child.children or [], aligner)


# -- spans -----------------------------------------------------------------------------------------------------
@dataclass
class _Tokens:
    """The answer's token records with their start offsets in the source; renders source runs as spans."""

    records: list
    starts: list[int]
    colour: bool
    base: int = 0  # source offset of the parsed chunk within the answer
    greedy: bool = False  # the answer ran at temperature 0 (the cards say why a draft was kept or rejected)

    def spans(self, piece: str, runs: list[tuple[int, int, int]], marks: tuple[Mark, ...] = ()) -> str:
        """The piece's characters as token spans; marks (piece offsets) colour its syntax inside them."""
        out: list[str] = []
        pending_index, pending = -1, []  # the open span's token and its (start, end) slices of the piece
        covered = 0
        starts, base = self.starts, self.base
        for offset, source_at, length in runs:
            if offset > covered:  # a gap: characters the aligner did not place (never happens for found pieces)
                out.append(_marked(piece, covered, offset, marks))
            at, left, p = source_at + base, length, offset
            index = max(bisect_right(starts, at) - 1, 0)
            while left > 0:
                end = starts[index + 1] if index + 1 < len(starts) else at + left
                take = max(min(left, end - at), 1)
                if index != pending_index:
                    if pending:
                        out.append(self._span(pending_index, piece, pending, marks))
                    pending_index, pending = index, []
                pending.append((p, p + take))
                at, p, left = at + take, p + take, left - take
                if left > 0 and index + 1 < len(starts):
                    index += 1
            covered = offset + length
        if pending:
            out.append(self._span(pending_index, piece, pending, marks))
        if covered < len(piece):
            out.append(_marked(piece, covered, len(piece), marks))
        return "".join(out)

    def _span(self, index: int, piece: str, slices: list[tuple[int, int]], marks: tuple[Mark, ...]) -> str:
        record = self.records[index] if 0 <= index < len(self.records) else {}
        text = "".join(piece[a:b] for a, b in slices)
        inner = "".join(_marked(piece, a, b, marks) for a, b in slices) if marks else None
        return token_span(record, self.colour, text, self.greedy, inner)


def _marked(piece: str, start: int, end: int, marks: tuple[Mark, ...]) -> str:
    """piece[start:end] escaped, its marked characters wrapped in their syntax class."""
    if not marks:
        return escape(piece[start:end])
    out, at = [], start
    for m_start, m_end, cls in marks[max(bisect_right(marks, (start, start, "")) - 1, 0) :]:
        if m_start >= end:
            break
        a, b = max(m_start, at), min(m_end, end)
        if a >= b:
            continue
        if a > at:
            out.append(escape(piece[at:a]))
        out.append(f'<span class="{cls}">{escape(piece[a:b])}</span>')
        at = b
    if at < end:
        out.append(escape(piece[at:end]))
    return "".join(out)


def _piece(token, env, marks: tuple[Mark, ...] = ()) -> str:
    tokens: _Tokens = env["tokens"]
    runs = token.meta.get("runs")
    return (
        tokens.spans(token.content, runs, marks)
        if runs is not None
        else _marked(token.content, 0, len(token.content), marks)
    )


def _text(self, tokens, idx, options, env):
    return _piece(tokens[idx], env)


def _code_inline(self, tokens, idx, options, env):
    return f"<code>{_piece(tokens[idx], env)}</code>"


def _code_block(self, tokens, idx, options, env):
    return f'<div class="ls-code"><pre><code>{_piece(tokens[idx], env)}</code></pre></div>'


def _fence(self, tokens, idx, options, env):
    token = tokens[idx]
    language = token.info.strip().split(maxsplit=1)[0] if token.info.strip() else ""
    label = (
        f'<span class="ls-code-lang">{escape(language)}</span>' if language else '<span class="ls-code-lang"></span>'
    )
    head = (
        f'<div class="ls-code-head">{label}'
        '<button type="button" class="ls-copy" title="copy the code">copy</button></div>'
    )
    code = _piece(token, env, code_marks(token.content, language))
    return f'<div class="ls-code">{head}<pre><code>{code}</code></pre></div>'


def _tool_call(self, tokens, idx, options, env):
    """A tool call as a card: the function's name, then the call's JSON, its tokens coloured as any others."""
    token = tokens[idx]
    found = TOOL_NAME.search(token.content)
    name = escape(found.group(1)) if found else ""
    label = f"tool call {name}".strip()
    head = f'<div class="ls-tool-head">tool call{f" <b>{name}</b>" if name else ""}</div>'
    call = _piece(token, env, code_marks(token.content, "json"))
    return f'<div class="ls-tool-call" role="group" aria-label="{label}">{head}<pre><code>{call}</code></pre></div>'


def _link_open(self, tokens, idx, options, env):
    href = tokens[idx].attrGet("href") or ""
    live = isinstance(href, str) and href.lower().startswith(LINK_SCHEMES)
    env.setdefault("links", []).append(live)
    if not live:
        return ""
    return f'<a href="{escape(href)}" target="_blank" rel="noopener noreferrer">'


def _link_close(self, tokens, idx, options, env):
    links = env.get("links") or [False]
    return "</a>" if links.pop() else ""


def _image(self, tokens, idx, options, env):
    alt = self.renderInline(tokens[idx].children or [], options, env)
    return f'<span class="ls-image" title="image (not loaded)">{alt}</span>'


def _as_text(self, tokens, idx, options, env):
    return escape(tokens[idx].content)


for _name, _rule in (
    ("text", _text),
    ("code_inline", _code_inline),
    ("code_block", _code_block),
    ("fence", _fence),
    ("tool_call", _tool_call),
    ("link_open", _link_open),
    ("link_close", _link_close),
    ("image", _image),
    ("html_block", _as_text),
    ("html_inline", _as_text),
):
    MD.add_render_rule(_name, _rule)


def _render_chunk(chunk: str, tokens: _Tokens) -> tuple[str, str, int]:
    """Parse one chunk: (HTML of its finished top-level blocks, HTML of its last block, chunk offset of the last
    block's first line)."""
    stream = MD.parse(chunk)
    _align(stream, _Aligner(chunk))
    env = {"tokens": tokens}
    tops = [i for i, t in enumerate(stream) if t.level == 0 and t.nesting >= 0]
    if len(tops) < 2:
        return "", MD.renderer.render(stream, MD.options, env), 0
    last = tops[-1]
    line = stream[last].map[0] if stream[last].map else 0
    starts = _line_starts(chunk)
    done = MD.renderer.render(stream[:last], MD.options, env)
    return done, MD.renderer.render(stream[last:], MD.options, env), min(starts[line], len(chunk))


# -- per-answer cache of finished blocks -----------------------------------------------------------------------
@dataclass
class _Done:
    records: list  # the records this entry covers (kept to check identity: the same answer, not an equal one)
    starts: list[int]
    text: str  # the concatenated text of those records
    done_len: int  # characters of text rendered into finished blocks
    html: str  # their HTML


_CACHE: OrderedDict[tuple[int, bool, bool], _Done] = OrderedDict()


def _cached(records: list, key: tuple[int, bool, bool]) -> Optional[_Done]:
    entry = _CACHE.get(key)
    if entry is None or len(entry.records) > len(records):
        return None
    if not all(map(operator.is_, entry.records, records)):
        return None
    _CACHE.move_to_end(key)
    return entry


def answer_markdown_html(records: list[dict], colour: bool = True, greedy: bool = False) -> str:
    """The answer's token records as rendered markdown with coloured token spans (inner HTML of the body).
    colour: the full colouring (else the subtle one); greedy: the answer ran at temperature 0."""
    records = [r for r in records if r.get("text")]
    if not records:
        return ""
    key = (id(records[0]), colour, greedy)
    entry = _cached(records, key)
    if entry is None:
        entry = _Done([], [], "", 0, "")
    starts, text = list(entry.starts), entry.text
    new = records[len(entry.records) :]
    if new:
        offset = len(text)
        for r in new:
            starts.append(offset)
            offset += len(r["text"])
        text = text + "".join(r["text"] for r in new)
    chunk = text[entry.done_len :]
    done, live, cut = _render_chunk(chunk, _Tokens(records, starts, colour, entry.done_len, greedy))
    _CACHE[key] = _Done(records, starts, text, entry.done_len + cut, entry.html + done)
    _CACHE.move_to_end(key)
    while len(_CACHE) > CACHE_ANSWERS:
        _CACHE.popitem(last=False)
    return entry.html + done + live


def plain_markdown_html(text: str) -> str:
    """Markdown without token records (a saved answer that kept only its text): rendered, one plain span."""
    if not text:
        return ""
    return answer_markdown_html([{"text": text, "kind": "target"}], colour=False)
