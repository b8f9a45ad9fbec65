"""Grammar-forced drafts: where a constrained answer's grammar allows one continuation only (a JSON key, its quote
and colon, a closing brace, the tool-call markup), those tokens are known before the target runs; drafted, they are
accepted whenever the target's masked distribution agrees, which it does wherever the mask leaves one token.

It drafts nothing where the grammar leaves a choice (a string value, a number): chat.py puts it first in a
LookupFirstProposer, so the entry's own proposer drafts the free parts. It reads the answer's grammar state and
changes nothing in it (the mask's processor owns it), and draws nothing: exact as any one-hot draft is.
"""

from __future__ import annotations

from typing import Protocol

from localspec.config import SamplingParams

from .base import Draft, DraftNoise, Proposer


class ForcedTokens(Protocol):
    def forced(self) -> list[int]:
        """The tokens the grammar forces next, after the answer so far."""
        ...


class GrammarForcedProposer(Proposer):
    name = "grammar"

    def __init__(self, grammar: ForcedTokens) -> None:
        self.grammar = grammar

    def propose(self, context_ids: list[int], k: int, sampling: SamplingParams, noise: DraftNoise) -> Draft:
        return Draft(self.grammar.forced()[:k])
