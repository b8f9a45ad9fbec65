"""Drafting from what the user wrote and was answered before: 'history' (and 'history+head').

Words: a *document* is one saved message's token ids (an answer, or a user message tokenized); the *history index*
(SuffixIndex) maps every 2-token window of every document to where it ends, so the continuations of a context's
suffix are found without scanning the documents; a *source* is where a continuation comes from, in priority order:
the *first source* (on Regenerate or Edit-and-resend, the answer being replaced), the current context (what the
n-gram lookup searches), then the history index.

Each step takes the longest suffix of the context (at least MIN_MATCH tokens, at most max_n) that occurs in any
source, and the continuations after every occurrence of that suffix (SuffixDecoding's idea: frequency over many
occurrences). As a chain, the best one: the first source, then the context (most recent), then the most recent
document. As a tree, all of them merged into a trie scored by their occurrences weighted by source (ngram.py's
trie_from_continuations). Drafts are one-hot, like the n-gram lookup's: the sampler's guarantee holds for any
drafted tokens chosen before the step's draws.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch

from localspec.config import SamplingParams
from localspec.runtime.tree import TREE_MAX_DEPTH, TokenTree

from .base import Draft, DraftNoise, Proposer
from .ngram import TREE_OCCURRENCES, ContextArray, longest_match, trie_from_continuations

MAX_MATCH = 16  # longest suffix compared: a longer match picks the occurrence that continues the same text
MIN_MATCH = 2  # the index keys on 2-token windows: a 1-token match across a whole history is a guess, not a lookup
SCAN_LIMIT = 256  # most recent candidate windows checked per lookup, so a common pair of tokens stays cheap
SOURCE_WEIGHT = {"first": 4.0, "context": 2.0, "history": 1.0}  # a tree node's score per occurrence, by source


@dataclass
class SuffixIndex:
    """Documents of token ids and, for each 2-token window, the (document, end) pairs where it occurs, oldest
    first. Thread-safe enough for one writer and readers that tolerate a document added mid-lookup."""

    docs: list[Optional[np.ndarray]] = field(default_factory=list)  # [L_d] int64 each; None once removed
    keys: list[Hashable] = field(default_factory=list)  # the caller's key per document (e.g. a message id)
    # (first, second) window → occurrences packed as document << 32 | end: ints, not tuples, so an index of a long
    # history stays a few bytes per token
    windows: dict[int, list[int]] = field(default_factory=dict)
    _by_key: dict[Hashable, int] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self._by_key)

    def add(self, key: Hashable, token_ids: Sequence[int]) -> None:
        """Index a document (replacing the one under the same key)."""
        self.remove(key)
        doc = np.asarray(token_ids, dtype=np.int64)
        index = len(self.docs)
        self.docs.append(doc)
        self.keys.append(key)
        self._by_key[key] = index
        values = doc.tolist()
        for end in range(1, len(values) - 1):  # a window ending at `end` continues at end + 1
            self.windows.setdefault(_window(values[end - 1], values[end]), []).append(index << 32 | end)

    def remove(self, key: Hashable) -> bool:
        index = self._by_key.pop(key, None)
        if index is None:
            return False
        self.docs[index] = None  # its windows are skipped from now on
        return True

    def continuations(self, suffix: np.ndarray, max_n: int, depth: int) -> tuple[int, list[list[int]]]:
        """(n, continuations) for the longest n ≤ max_n such that the last n tokens of `suffix` occur in a
        document: what followed each occurrence (≤ depth tokens), the most recent document first. (0, []) when no
        MIN_MATCH-token suffix occurs."""
        if len(suffix) < MIN_MATCH:
            return 0, []
        tail = suffix.tolist()
        best, found = 0, []
        for packed in reversed(self.windows.get(_window(tail[-2], tail[-1]), [])[-SCAN_LIMIT:]):
            index, end = packed >> 32, packed & 0xFFFFFFFF
            doc = self.docs[index]
            if doc is None or end + 1 >= len(doc):
                continue
            n = MIN_MATCH
            while n < max_n and n < len(tail) and end - n >= 0 and doc[end - n] == tail[-n - 1]:
                n += 1
            if n > best:
                best, found = n, []
            if n == best:
                found.append(doc[end + 1 : end + 1 + depth].tolist())
        return best, found


def _window(first: int, second: int) -> int:
    return first << 32 | second


class HistoryProposer(Proposer):
    """Lookup over the first source, the context and the history index (see the module docstring)."""

    name = "history"
    wants_hidden = False
    supports_tree = True
    context_only = True

    def __init__(
        self, index: SuffixIndex, min_n: int = MIN_MATCH, max_n: int = MAX_MATCH, first_source: Sequence[int] = ()
    ) -> None:
        self.index = index
        self.min_n = max(min_n, MIN_MATCH)
        self.max_n = max(max_n, self.min_n)
        self.first = SuffixIndex()
        if len(first_source) > MIN_MATCH:
            self.first.add("first", first_source)
        self._context = ContextArray()

    def begin(self, prompt_ids: list[int], prompt_hidden: Optional[torch.Tensor]) -> None:
        self._context.reset(prompt_ids)

    def on_verified(self, num_accepted: int, emitted_ids: list[int], target_hidden: Optional[torch.Tensor]) -> None:
        self._context.extend(emitted_ids)

    def _sync(self, context_ids: list[int]) -> np.ndarray:
        return self._context.of(context_ids)

    def candidates(self, context_ids: list[int], depth: int) -> list[tuple[str, list[int]]]:
        """(source, continuation) for every occurrence of the longest suffix found in any source, best first."""
        context = self._sync(context_ids)
        suffix = context[-(self.max_n + 1) :]
        found: list[tuple[int, str, list[int]]] = []
        n_first, first = self.first.continuations(suffix, self.max_n, depth)
        found += [(n_first, "first", c) for c in first]
        n_context, hits = longest_match(context, self.min_n, self.max_n)
        recent = hits[::-1][:TREE_OCCURRENCES]
        found += [(n_context, "context", context[s + n_context : s + n_context + depth].tolist()) for s in recent]
        n_history, history = self.index.continuations(suffix, self.max_n, depth)
        found += [(n_history, "history", c) for c in history[:TREE_OCCURRENCES]]
        found = [f for f in found if f[0] >= self.min_n and f[2]]
        if not found:
            return []
        longest = max(f[0] for f in found)
        return [(source, c) for n, source, c in found if n == longest]  # sources stay in priority order

    def propose(self, context_ids: list[int], k: int, sampling: SamplingParams, noise: DraftNoise) -> Draft:
        found = self.candidates(context_ids, k)
        return Draft(token_ids=found[0][1][:k] if found else [])

    def propose_tree(
        self, context_ids: list[int], n_nodes: int, sampling: SamplingParams, noise: DraftNoise
    ) -> Optional[TokenTree]:
        found = self.candidates(context_ids, min(TREE_MAX_DEPTH, n_nodes))
        weighted = [(c, SOURCE_WEIGHT[source]) for source, c in found]
        return trie_from_continuations(weighted, n_nodes)
