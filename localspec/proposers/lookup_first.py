"""Lookup first, a trained model otherwise: 'ngram+head'.

Each step asks the lookup (n-gram prompt lookup, free) for a continuation of the context; only when it finds none
does the model (a feature-level head) draft. Both are told every verified token, so the head's caches keep up with
the answer while the lookup is drafting (the head feeds the positions it missed in one batch the next time it is
asked).

Lossless: which of the two drafts is decided by the context alone, before any random draw of this step, and each
draft carries its own draft distribution (the lookup's is one-hot, probs None), which is all the rejection sampler
needs. On the embedded default's held-out prompts it accepts more per target forward than either part alone (the
lookup is strong on code, which repeats the prompt; the head on prose); chat.py gives the lookup a 2-token minimum
match, below which the head guesses better. `part()` tells the engine which part drafts next, so adaptive K keeps
one controller (costs, acceptance, best K) per part.
"""

from __future__ import annotations

from typing import Optional

import torch

from localspec.config import SamplingParams

from .base import Draft, Proposer

_PEEK = SamplingParams()  # the lookup is deterministic: peeking at it draws nothing
_PEEK_GENERATOR = torch.Generator()


class LookupFirstProposer(Proposer):
    def __init__(self, lookup: Proposer, model: Proposer) -> None:
        self.lookup = lookup
        self.model = model
        self.name = f"{lookup.name}+{model.name}"
        self.wants_hidden = lookup.wants_hidden or model.wants_hidden
        self.feature_layers = tuple(model.feature_layers)
        self._no_match_at: Optional[int] = None  # context length where part() found no lookup match

    def part(self, context_ids: list[int]) -> str:
        """Which part will draft after context_ids: the lookup when it has a match (a deterministic peek), else the
        model. The engine keeps one adaptive-K controller per part. A miss is remembered, so propose() on the same
        context goes straight to the model instead of searching again (a miss scans every n-gram size)."""
        peek = self.lookup.propose(context_ids, 1, _PEEK, _PEEK_GENERATOR)
        self._no_match_at = None if peek.token_ids else len(context_ids)
        return self.lookup.name if peek.token_ids else self.model.name

    def begin(self, prompt_ids: list[int], prompt_hidden: Optional[torch.Tensor]) -> None:
        self._no_match_at = None
        self.lookup.begin(prompt_ids, prompt_hidden)
        self.model.begin(prompt_ids, prompt_hidden)

    def propose(self, context_ids: list[int], k: int, sampling: SamplingParams, generator: torch.Generator) -> Draft:
        if self._no_match_at != len(context_ids):
            draft = self.lookup.propose(context_ids, k, sampling, generator)
            if draft.token_ids:
                return draft
        return self.model.propose(context_ids, k, sampling, generator)

    def on_verified(self, num_accepted: int, emitted_ids: list[int], target_hidden: Optional[torch.Tensor]) -> None:
        self.lookup.on_verified(num_accepted, emitted_ids, target_hidden)
        self.model.on_verified(num_accepted, emitted_ids, target_hidden)
