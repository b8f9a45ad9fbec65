"""Target logits processors: what changes the target's distribution before anything is drawn from it (the penalties,
penalties.py; a grammar's token mask), in one place that plain decoding and every verifier go through.

A step's verify forward scores rows: row r is the distribution of the token that follows the answer so far plus
paths[r], the drafted tokens on the way to that row (a chain's row i: its first i drafts; a tree's row: its node's
root path). A processor changes each row as a function of that prefix only, so a row is processed the same way
whether it is scored alone (plain decoding) or among drafts (speculation): the rejection sampler then stays exact
for the processed distribution, and greedy speculative output equals greedy plain output bitwise wherever the
forward's rows do. A row after a drafted token the processor forbids is never read (that draft is rejected first),
so it may be left as it is. The tokens a step emits are committed afterwards, in order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from .tree import TokenTree


class TargetProcessor(Protocol):
    def process(self, logits: torch.Tensor, paths: Sequence[Sequence[int]]) -> torch.Tensor:
        """logits [rows, V] of the verify forward → processed logits [rows, V] (a forbidden token: -inf).
        paths[r]: the drafted tokens between the committed answer and row r."""
        ...

    def commit(self, tokens: Sequence[int]) -> None:
        """The tokens the step emitted, in order: the answer so far now ends with them."""
        ...


def chain_paths(draft_ids: Sequence[int]) -> list[list[int]]:
    """A chain's rows: row i follows the first i drafts (K drafts, K + 1 rows)."""
    return [list(draft_ids[:i]) for i in range(len(draft_ids) + 1)]


def tree_paths(tree: TokenTree) -> list[list[int]]:
    """A tree's rows: row 0 is the pending token's (no drafts), row i + 1 follows node i's root path, node i last."""
    paths: list[list[int]] = [[]]
    for token, parent in zip(tree.token_ids, tree.parents):
        paths.append(paths[parent + 1] + [token])
    return paths


def apply_processors(
    processors: Sequence[TargetProcessor], logits: torch.Tensor, paths: Sequence[Sequence[int]]
) -> torch.Tensor:
    """logits [rows, V] through each processor in order (unchanged, the same tensor, without any)."""
    for processor in processors:
        logits = processor.process(logits, paths)
    return logits


def commit_processors(processors: Sequence[TargetProcessor], tokens: Sequence[int]) -> None:
    for processor in processors:
        processor.commit(tokens)
