"""Prompt lookup: find the longest recent n-gram that also appears earlier in the context, propose what followed."""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from localspec.config import SamplingParams

from .base import Draft, Proposer


def find_continuation(context: np.ndarray, k: int, min_n: int, max_n: int) -> list[int]:
    """Longest suffix match of size max_n..min_n; the most recent earlier occurrence wins. Returns ≤ k ids."""
    length = len(context)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = context[length - n :]
        # windows over context[:-1] so the suffix cannot match itself; a match at j continues at j + n
        windows = np.lib.stride_tricks.sliding_window_view(context[: length - 1], n)
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return context[start : start + k].tolist()
    return []


class NgramProposer(Proposer):
    """Needs no weights. Its draft is one-hot: the rejection sampler treats p_draft(token) as 1."""

    name = "ngram"
    wants_hidden = False

    def __init__(self, min_n: int = 1, max_n: int = 4) -> None:
        self.min_n = min_n
        self.max_n = max_n
        self._context = np.zeros(0, dtype=np.int64)

    def begin(self, prompt_ids: list[int], prompt_hidden: Optional[torch.Tensor]) -> None:
        self._context = np.asarray(prompt_ids, dtype=np.int64)

    def propose(self, context_ids: list[int], k: int, sampling: SamplingParams, generator: torch.Generator) -> Draft:
        if len(context_ids) != len(self._context):
            self._context = np.asarray(context_ids, dtype=np.int64)
        return Draft(token_ids=find_continuation(self._context, k, self.min_n, self.max_n))

    def on_verified(self, num_accepted: int, emitted_ids: list[int], target_hidden: Optional[torch.Tensor]) -> None:
        self._context = np.concatenate([self._context, np.asarray(emitted_ids, dtype=np.int64)])
