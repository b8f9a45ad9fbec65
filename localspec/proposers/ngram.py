"""Prompt lookup: find the longest recent n-gram that also appears earlier in the context, propose what followed.

As a chain (propose): the continuation after the most recent earlier occurrence of the longest matching suffix.
As a tree (propose_tree): every recent occurrence of that suffix offers its continuation; they merge into a trie,
each node scored by the share of occurrences that pass through it (the most recent breaks ties), and the n_nodes
best-scored nodes are kept — a node never scores above its parent, so the kept set is closed under ancestors. Where
the text repeats itself one way the tree is one long branch; where it forks (the same words followed by different
ones earlier in the chat) both forks are verified in the same forward.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from localspec.config import SamplingParams
from localspec.runtime.tree import TREE_MAX_DEPTH, TokenTree

from .base import Draft, DraftNoise, Proposer

TREE_OCCURRENCES = 32  # most recent occurrences of the matched suffix whose continuations build the tree


def last_token_ends(context: np.ndarray) -> np.ndarray:
    """Where the last token occurs earlier (positions in context[:-1], ascending): every earlier occurrence of a
    suffix ends at one of them."""
    return np.flatnonzero(context[: len(context) - 1] == context[-1]) if len(context) > 1 else np.zeros(0, np.int64)


def occurrences(context: np.ndarray, n: int, ends: np.ndarray | None = None) -> np.ndarray:
    """Start positions of the earlier occurrences of the last n tokens, oldest first (empty when n is too long).
    Checked only where the last token occurs earlier (`ends`: last_token_ends, computed once for several n), not at
    every window: on a miss, the common case, that is a handful of positions instead of the whole context."""
    length = len(context)
    if not 0 < n < length:
        return np.zeros(0, dtype=np.int64)
    ends = last_token_ends(context) if ends is None else ends
    # a match starting at j ends at j + n - 1 ≤ length - 2 (never the suffix itself) and continues at j + n
    starts = ends[ends >= n - 1] - (n - 1)
    for offset in range(n - 1):
        starts = starts[context[starts + offset] == context[length - n + offset]]
    return starts


def longest_match(context: np.ndarray, min_n: int, max_n: int) -> tuple[int, np.ndarray]:
    """(n, occurrences(context, n)) for the longest n in max_n..min_n that occurs earlier; (0, empty) when none
    does."""
    ends = last_token_ends(context)
    for n in range(min(max_n, len(context) - 1), min_n - 1, -1):
        hits = occurrences(context, n, ends)
        if hits.size:
            return n, hits
    return 0, np.zeros(0, dtype=np.int64)


def find_continuation(context: np.ndarray, k: int, min_n: int, max_n: int) -> list[int]:
    """Longest suffix match of size max_n..min_n; the most recent earlier occurrence wins. Returns ≤ k ids."""
    n, hits = longest_match(context, min_n, max_n)
    if not n:
        return []
    start = int(hits[-1]) + n
    return context[start : start + k].tolist()


def continuation_tree(context: np.ndarray, n_nodes: int, min_n: int, max_n: int) -> Optional[TokenTree]:
    """The trie of what followed the recent occurrences of the longest matching suffix, cut to its n_nodes
    best-scored nodes (see the module docstring); None when no suffix matches."""
    n, hits = longest_match(context, min_n, max_n)
    if not n or n_nodes <= 0:
        return None
    depth = min(TREE_MAX_DEPTH, n_nodes)
    recent = hits[::-1][:TREE_OCCURRENCES]
    return trie_from_continuations([(context[s + n : s + n + depth].tolist(), 1.0) for s in recent], n_nodes)


def trie_from_continuations(continuations: list[tuple[list[int], float]], n_nodes: int) -> Optional[TokenTree]:
    """Merge (continuation, weight) pairs into a trie whose nodes score the weights of the continuations through
    them, and keep the n_nodes best-scored nodes; the list's order breaks ties (earlier first). A node never
    scores above its parent, so the kept set is closed under ancestors. None when nothing continues."""
    if n_nodes <= 0:
        return None
    score: dict[tuple[int, ...], float] = {}
    for rank, (continuation, weight) in enumerate(continuations):
        weight = weight + 1e-6 * (len(continuations) - rank)  # the order only breaks ties
        for j in range(min(len(continuation), TREE_MAX_DEPTH)):
            prefix = tuple(continuation[: j + 1])
            score[prefix] = score.get(prefix, 0.0) + weight
    if not score:
        return None
    kept = sorted(score, key=lambda path: (-score[path], len(path)))[:n_nodes]
    kept.sort(key=lambda path: (len(path), -score[path]))  # parents before children, best sibling first
    index = {path: i for i, path in enumerate(kept)}
    return TokenTree([path[-1] for path in kept], [index[path[:-1]] if len(path) > 1 else -1 for path in kept])


class ContextArray:
    """A lookup's context as an int64 array: extended by the emitted tokens after each step, rebuilt when a propose
    call asks about another list (a lookup continuing drafts not yet verified, proposers/grammar.py, passes its own
    list, which the next call on the answer's context does not match)."""

    def __init__(self) -> None:
        self.array = np.zeros(0, dtype=np.int64)
        self._of: Optional[list[int]] = None  # the list the array was last built from or checked against

    def reset(self, ids: list[int]) -> None:
        self.array, self._of = np.asarray(ids, dtype=np.int64), None

    def of(self, ids: list[int]) -> np.ndarray:
        if ids is not self._of or len(ids) != len(self.array):
            self.array = np.asarray(ids, dtype=np.int64)
        self._of = ids
        return self.array

    def extend(self, emitted_ids: list[int]) -> None:
        self.array = np.concatenate([self.array, np.asarray(emitted_ids, dtype=np.int64)])


class NgramProposer(Proposer):
    """Needs no weights. Its draft is one-hot: the rejection sampler treats p_draft(token) as 1."""

    name = "ngram"
    wants_hidden = False
    supports_tree = True
    context_only = True

    def __init__(self, min_n: int = 1, max_n: int = 4) -> None:
        self.min_n = min_n
        self.max_n = max_n
        self._context = ContextArray()

    def begin(self, prompt_ids: list[int], prompt_hidden: Optional[torch.Tensor]) -> None:
        self._context.reset(prompt_ids)

    def propose(self, context_ids: list[int], k: int, sampling: SamplingParams, noise: DraftNoise) -> Draft:
        return Draft(token_ids=find_continuation(self._context.of(context_ids), k, self.min_n, self.max_n))

    def propose_tree(
        self, context_ids: list[int], n_nodes: int, sampling: SamplingParams, noise: DraftNoise
    ) -> Optional[TokenTree]:
        return continuation_tree(self._context.of(context_ids), n_nodes, self.min_n, self.max_n)

    def on_verified(self, num_accepted: int, emitted_ids: list[int], target_hidden: Optional[torch.Tensor]) -> None:
        self._context.extend(emitted_ids)
