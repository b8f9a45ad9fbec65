"""Constrained decoding: a grammar (from a JSON schema, or the tool-call format) → a token mask on the target's
distribution at every position, by llguidance (a maintained Rust library that computes the mask for a tokenizer's
whole vocabulary in tens of microseconds, on the CPU).

Constraint is what a request asks for (checked without a model); GrammarProcessor is one answer's matcher, a
TargetProcessor (runtime/logits_processors.py): the engine masks every verify row with it, so plain and speculative
decoding draw from the same constrained distribution.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from localspec.config import ConfigError

COMPACT_JSON = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass(frozen=True)
class Constraint:
    """A grammar in llguidance's form, and what the request called it (for messages)."""

    grammar: str
    what: str


def _llguidance():
    try:
        import llguidance
    except ImportError as exc:  # a broken install: the request is refused, the server stays up
        raise ConfigError(f"constrained decoding needs the llguidance package ({exc})") from None
    return llguidance


def checked(grammar: str, what: str) -> Constraint:
    """A Constraint, or a ConfigError naming `what` when llguidance refuses the grammar."""
    error = _llguidance().LLMatcher.validate_grammar(grammar)
    if error and not error.startswith("WARNING"):
        raise ConfigError(f"{what}: {error.strip().splitlines()[0]}")
    return Constraint(grammar, what)


def compact(schema: dict[str, Any]) -> dict[str, Any]:
    """schema with llguidance's layout options: JSON as json.dumps writes it (", " and ": ", no other whitespace),
    so a model writes what it has read most and the layout tokens are forced (free drafts); a schema's own
    x-guidance options win."""
    return {**schema, "x-guidance": {**COMPACT_JSON, **(schema.get("x-guidance") or {})}}


def json_schema_constraint(schema: dict[str, Any], what: str) -> Constraint:
    """Output that is one JSON value valid against `schema` (the JSON Schema subset llguidance supports)."""
    try:
        grammar = _llguidance().LLMatcher.grammar_from_json_schema(json.dumps(compact(schema)))
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{what}: {exc}") from None
    return checked(grammar, what)


def lark_constraint(lark: str, what: str) -> Constraint:
    try:
        grammar = _llguidance().LLMatcher.grammar_from_lark(lark)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{what}: {exc}") from None
    return checked(grammar, what)


class GrammarTokenizer:
    """A tokenizer in llguidance's form, made once per loaded model (about a second for a large vocabulary); every
    stop token of the answer counts as the grammar's end."""

    def __init__(self, tokenizer, stop_token_ids: Sequence[int]) -> None:
        self.tokenizer, self.stop_token_ids = tokenizer, sorted(stop_token_ids)
        self._made = None
        self._lock = threading.Lock()

    def get(self):
        with self._lock:
            if self._made is None:
                import llguidance.hf

                try:
                    self._made = llguidance.hf.from_tokenizer(self.tokenizer, eos_token=self.stop_token_ids or None)
                except ValueError as exc:  # a slow (Python) tokenizer
                    raise ConfigError(f"constrained decoding needs a fast tokenizer: {exc}") from None
            return self._made

    def processor(self, constraint: Constraint) -> GrammarProcessor:
        matcher = _llguidance().LLMatcher(self.get(), constraint.grammar, log_level=0)
        if matcher.is_error():
            raise ConfigError(f"{constraint.what}: {matcher.get_error()}")
        return GrammarProcessor(matcher, self.get().vocab_size, frozenset(self.stop_token_ids))


class GrammarProcessor:
    """One answer's grammar state. process() masks each verify row with the tokens the grammar allows after that
    row's path (consumed, masked, rolled back); commit() advances the state by the emitted tokens.

    Where the grammar forces text (a key, its quotes and colon, a closing brace), the row allows the first of
    llguidance's fast-forward tokens only: the tokenizer's own split of that text (what llguidance's whole mask
    allows there too, on the embedded tokenizer's JSON answers), from a fast-forward query (~11 us) instead of a
    whole-vocabulary mask (~85 us). Plain and speculative decoding read the same rows: the answer stays exact for
    this distribution, and forced drafts are kept with probability 1."""

    def __init__(self, matcher, grammar_vocab: int, stop_token_ids: frozenset[int] = frozenset()) -> None:
        self.matcher = matcher
        self.stop_token_ids = stop_token_ids  # they end the answer: nothing follows them to match
        self.grammar_vocab = grammar_vocab
        self.words = (grammar_vocab + 31) // 32  # one int32 word holds 32 tokens, lowest bit first

    def _mask_into(self, words: np.ndarray) -> None:
        """words [self.words] int32 ← the tokens allowed next in the matcher's current state (left all ones where
        the grammar allows nothing: a stopped matcher's row is never read)."""
        forced = self.matcher.compute_ff_tokens()
        if forced:
            words[:] = 0
            words[forced[0] // 32] = np.int32(np.uint32(1 << forced[0] % 32).view(np.int32))
            return
        self.matcher.unsafe_compute_mask_ptr(words.ctypes.data, words.nbytes)
        if not words.any():
            words[:] = -1

    def allowed_length(self, path: Sequence[int]) -> int:
        """How many tokens at the start of path the grammar allows, one after another after the answer so far."""
        inside = next((i for i, t in enumerate(path) if not 0 <= t < self.grammar_vocab), len(path))
        return self.matcher.validate_tokens(list(path[:inside])) if inside else 0

    def _take(self, path: Sequence[int]) -> int:
        """Consume the longest start of path the grammar allows; return its length."""
        taken = self.allowed_length(path)
        if taken:
            self.matcher.consume_tokens(list(path[:taken]))
        return taken

    def process(self, logits: torch.Tensor, paths: Sequence[Sequence[int]]) -> torch.Tensor:
        rows, vocab = logits.shape
        words = np.full((rows, self.words), -1, dtype=np.int32)  # all ones: a row left as it is
        masked = np.zeros(rows, dtype=bool)
        for row, path in enumerate(paths):
            taken = self._take(path)
            # a row after a forbidden draft is never read (that draft is rejected first): it is left as it is
            if taken == len(path):
                self._mask_into(words[row])
                masked[row] = True
            if taken:
                self.matcher.rollback(taken)
        bits = np.unpackbits(words.view(np.uint8), axis=1, bitorder="little")  # [rows, 32 * words]
        width = min(vocab, self.grammar_vocab)
        allowed = np.ones((rows, vocab), dtype=bool)
        allowed[:, :width] = bits[:, :width]
        allowed[masked, width:] = False  # columns the tokenizer has no token for (a padded output)
        return logits.masked_fill(torch.from_numpy(~allowed).to(logits.device), float("-inf"))

    def commit(self, tokens: Sequence[int]) -> None:
        tokens = [t for t in tokens if t not in self.stop_token_ids]
        if not self.matcher.consume_tokens(tokens):
            raise ConfigError(f"the grammar refused an emitted token of {tokens}: {self.matcher.get_error()[:200]}")

    def forced(self, after: Sequence[int] = ()) -> list[int]:
        """The tokens the grammar forces next, one after another before any choice (free drafts), after the answer
        so far followed by `after` (drafts not yet verified); [] where the grammar refuses `after`. The state is
        left as it was."""
        taken = self._take(after)
        try:
            return list(self.matcher.compute_ff_tokens()) if taken == len(after) else []
        finally:
            if taken:
                self.matcher.rollback(taken)
