"""Syntax colours for an answer's fenced code: which characters of a code block are a keyword, a string, a comment,
a number or a name being defined, by Pygments' lexer for the fence's language.

The colours are marks (start, end, class) over the code's characters, never a second rendering: markdown.py splits
each token's span at them, so every character keeps its token's provenance colour and card, and the syntax only
sets the text colour inside it (assets/style.css, `.hl-*`).

Streaming: a fence's code is lexed up to its last complete line and the marks kept per (language, that prefix), so an
answer that writes a long block lexes it once a line, not once an update; the line being written shows uncoloured.
"""

from __future__ import annotations

from collections import OrderedDict
from functools import lru_cache
from typing import Optional

from pygments.lexer import Lexer
from pygments.lexers import get_lexer_by_name
from pygments.token import Comment, Keyword, Name, Number, String, _TokenType
from pygments.util import ClassNotFound

Mark = tuple[int, int, str]  # code[start:end] has the class

MAX_CODE_CHARS = 20_000  # a longer block is shown uncoloured past this (lexing stays a few ms an update)
CACHE_BLOCKS = 64
# the Pygments token types coloured, first match wins; everything else keeps the body's text colour
CLASSES: tuple[tuple[_TokenType, str], ...] = (
    (Comment, "hl-com"),
    (String, "hl-str"),
    (Number, "hl-num"),
    (Keyword, "hl-kw"),
    (Name.Function, "hl-def"),
    (Name.Class, "hl-def"),
    (Name.Builtin, "hl-kw"),
)

_MARKS: OrderedDict[tuple[str, str], tuple[Mark, ...]] = OrderedDict()


@lru_cache(maxsize=64)
def lexer_for(language: str) -> Optional[Lexer]:
    """Pygments' lexer for a fence's language name (its aliases: py, js, c++, sh …), or None."""
    name = language.strip().lower()
    if not name or len(name) > 40:
        return None
    try:
        return get_lexer_by_name(name, stripnl=False, ensurenl=False)
    except ClassNotFound:
        return None


def _class_of(kind: _TokenType) -> Optional[str]:
    return next((cls for parent, cls in CLASSES if kind in parent), None)


def _lex(lexer: Lexer, code: str) -> tuple[Mark, ...]:
    marks: list[Mark] = []
    for start, kind, value in lexer.get_tokens_unprocessed(code):
        cls = _class_of(kind)
        if cls is None or not value:
            continue
        end = start + len(value)
        if marks and marks[-1][1] == start and marks[-1][2] == cls:
            marks[-1] = (marks[-1][0], end, cls)
        else:
            marks.append((start, end, cls))
    return tuple(marks)


def code_marks(code: str, language: str) -> tuple[Mark, ...]:
    """The syntax marks of a code block's complete lines, sorted and not overlapping; () for a language that
    Pygments does not know (or none given)."""
    lexer = lexer_for(language)
    if lexer is None:
        return ()
    lines = code[: code.rfind("\n", 0, MAX_CODE_CHARS) + 1]
    if not lines:
        return ()
    key = (language, lines)
    marks = _MARKS.get(key)
    if marks is None:
        try:
            marks = _lex(lexer, lines)
        except Exception:  # a lexer that fails on odd input: the code shows uncoloured, never an error
            marks = ()
        _MARKS[key] = marks
        while len(_MARKS) > CACHE_BLOCKS:
            _MARKS.popitem(last=False)
    else:
        _MARKS.move_to_end(key)
    return marks
