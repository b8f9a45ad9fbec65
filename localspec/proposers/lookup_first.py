"""Lookup first, a trained model otherwise: 'ngram+head'.

Each step asks the lookup (n-gram prompt lookup, free) for a continuation of the context; only when it finds none
does the model (a feature-level head) draft. Both are told every verified token, so the head's caches keep up with
the answer while the lookup is drafting (the head feeds the positions it missed in one batch the next time it is
asked).

Lossless: which of the two drafts is decided by the context alone (a deterministic peek at the lookup, drawing
nothing from the step's noise), before any random draw of this step, and each draft carries its own draft
distribution (the lookup's is one-hot, probs None), which is all the rejection sampler needs. Token trees
(propose_tree) follow the same rule: the lookup's tree when it has a match, else the model's; a part without trees
offers its chain as a one-branch tree, whose nodes the tree verifier treats as one-hot drafts like every tree node
(exact for any drafted tokens chosen before the verifier's draws). On the embedded default's held-out prompts it
accepts more per target forward than either part alone (the lookup is strong on code, which repeats the prompt;
the head on prose); chat.py gives the lookup a 2-token minimum match, below which the head guesses better.
`part()` tells the engine which part drafts next, so adaptive K keeps one controller (costs, acceptance, best K)
per part.
"""

from __future__ import annotations

from typing import Optional

import torch

from localspec.config import SamplingParams
from localspec.runtime.tree import TokenTree

from .base import PEEK, PEEK_NOISE, Draft, DraftNoise, Proposer, tree_of


class LookupFirstProposer(Proposer):
    def __init__(self, lookup: Proposer, model: Proposer) -> None:
        self.lookup = lookup
        self.model = model
        self.name = f"{lookup.name}+{model.name}"
        self.wants_hidden = lookup.wants_hidden or model.wants_hidden
        self.feature_layers = tuple(model.feature_layers)
        self.supports_tree = lookup.supports_tree or model.supports_tree
        self._peeked: Optional[tuple[int, bool]] = None  # (context length, the lookup matched) from part()

    def part(self, context_ids: list[int]) -> str:
        """Which part will draft after context_ids: the lookup when it has a match (a deterministic peek), else the
        model. The engine keeps one adaptive-K controller per part. The answer is remembered for this context
        length, so propose() / propose_tree() on the same context do not search again (a miss scans every n-gram
        size)."""
        return self.lookup.name if self._lookup_matches(context_ids) else self.model.name

    def _lookup_matches(self, context_ids: list[int]) -> bool:
        if self._peeked is None or self._peeked[0] != len(context_ids):
            peek = self.lookup.propose(context_ids, 1, PEEK, PEEK_NOISE)
            self._peeked = (len(context_ids), bool(peek.token_ids))
        return self._peeked[1]

    def begin(self, prompt_ids: list[int], prompt_hidden: Optional[torch.Tensor]) -> None:
        self._peeked = None
        self.lookup.begin(prompt_ids, prompt_hidden)
        self.model.begin(prompt_ids, prompt_hidden)

    def propose(self, context_ids: list[int], k: int, sampling: SamplingParams, noise: DraftNoise) -> Draft:
        if self._peeked != (len(context_ids), False):
            draft = self.lookup.propose(context_ids, k, sampling, noise)
            if draft.token_ids:
                return draft
        return self.model.propose(context_ids, k, sampling, noise)

    def propose_tree(
        self, context_ids: list[int], n_nodes: int, sampling: SamplingParams, noise: DraftNoise
    ) -> Optional[TokenTree]:
        """The lookup's tree when the lookup matches the context, else the model's; a part without trees gives its
        chain of n_nodes drafts as a one-branch tree. None: neither drafts here (the step runs plain)."""
        if self._lookup_matches(context_ids):
            tree = tree_of(self.lookup, context_ids, n_nodes, sampling, noise)
            if tree is not None:
                return tree
        return tree_of(self.model, context_ids, n_nodes, sampling, noise)

    def on_verified(self, num_accepted: int, emitted_ids: list[int], target_hidden: Optional[torch.Tensor]) -> None:
        self.lookup.on_verified(num_accepted, emitted_ids, target_hidden)
        self.model.on_verified(num_accepted, emitted_ids, target_hidden)
