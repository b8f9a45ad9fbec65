"""Grammar-guided drafts: a constrained answer's grammar knows part of the answer before the target runs.

Words:
- forced tokens: where the grammar allows one continuation only (a JSON key, its quotes and colon, a closing brace,
  the tool-call markup): llguidance's fast-forward tokens, which the grammar's mask makes the only token of their
  rows (structured/grammar.py): drafted, they are kept with probability 1.
- free part: where the grammar leaves a choice (a string value, a number).
- lookup: the answer's own n-gram lookup over the request and the answer so far, matching from one token (the values
  of a constrained answer are mostly copied from the request: a name, a city, a date); it drafts from the context
  alone (Proposer.context_only), so it may continue drafts not yet verified.
- the entry's proposer: drafts a free part where nothing is forced and the lookup finds no match; a head or a draft
  model keeps state, so it drafts after the verified answer only.

A step's chain of at most k drafts:
1. the forced tokens after the answer so far (all of them: they are `certain`, so the step's plan asks for at least
   as many, engine/policy.py);
2. a free part: the lookup's continuation (the entry's proposer's where nothing was drafted before it and the lookup
   has none), cut at its first token the grammar refuses (no row after it could be kept);
3. the forced tokens after that; then 2-3 again while k allows and the lookup finds a match.
A step's tree: the forced tokens as a trunk, the lookup's tree after them (the entry's where nothing is forced and the
lookup has none), each node the grammar refuses dropped with its subtree, and the forced tokens after the first
branch's leaf while the node budget allows.

Exact: a token is chosen from the context and the grammar (one-hot: the rejection sampler's p_draft is 1) or drawn by
the entry's proposer at draft positions 0.. with its own distribution, as when it drafts alone; the tokens appended
after a drawn draft carry one-hot rows. It reads the answer's grammar state and leaves it as it was (the mask's
processor owns it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional, Protocol

import torch

from localspec.config import SamplingParams
from localspec.runtime.tree import TokenTree

from .base import PEEK, PEEK_NOISE, Draft, DraftNoise, Proposer, tree_of

FORCED_PART = "grammar"  # the part (adaptive K's controller) of a step that begins with forced tokens
LOOKUP_PART = "lookup"  # … of a step whose first free part the lookup drafts
PEEK_TOKENS = 16  # the lookup's continuation read once a step, for part() and the chain's first free part


class GrammarState(Protocol):
    def forced(self, after: Sequence[int] = ()) -> list[int]:
        """The tokens the grammar forces next after the answer so far and `after`; [] where it refuses `after`."""
        ...

    def allowed_length(self, path: Sequence[int]) -> int:
        """How many tokens at the start of path the grammar allows after the answer so far."""
        ...


class GrammarGuidedProposer(Proposer):
    def __init__(self, grammar: GrammarState, inner: Proposer, lookup: Proposer) -> None:
        if not lookup.context_only:
            raise ValueError(f"the grammar's lookup must draft from the context alone ({lookup.name} does not)")
        self.grammar = grammar
        self.inner = inner
        self.lookup = lookup
        self.name = f"{FORCED_PART}+{inner.name}"
        self.wants_hidden = inner.wants_hidden
        self.feature_layers = tuple(inner.feature_layers)
        self.supports_tree = True  # the trunk and the lookup's tree, or the entry's drafts as a one-branch tree
        # (context length, the forced tokens, the lookup's continuation where nothing is forced)
        self._step: Optional[tuple[int, list[int], list[int]]] = None

    def _now(self, context_ids: list[int]) -> tuple[list[int], list[int]]:
        """(the forced tokens after the verified answer, the lookup's continuation of it where nothing is forced),
        asked once per step: part() and the proposing call both need them."""
        if self._step is None or self._step[0] != len(context_ids):
            forced = self.grammar.forced()
            looked = [] if forced else self.lookup.propose(context_ids, PEEK_TOKENS, PEEK, PEEK_NOISE).token_ids
            self._step = (len(context_ids), forced, list(looked))
        return self._step[1], self._step[2]

    def part(self, context_ids: list[int]) -> Optional[str]:
        forced, looked = self._now(context_ids)
        if forced:
            return FORCED_PART
        return LOOKUP_PART if looked else self.inner.part(context_ids) or self.inner.name

    def certain(self, context_ids: list[int]) -> int:
        return len(self._now(context_ids)[0])

    def begin(self, prompt_ids: list[int], prompt_hidden: Optional[torch.Tensor]) -> None:
        self._step = None
        self.lookup.begin(prompt_ids, prompt_hidden)
        self.inner.begin(prompt_ids, prompt_hidden)

    def on_verified(self, num_accepted: int, emitted_ids: list[int], target_hidden: Optional[torch.Tensor]) -> None:
        self.lookup.on_verified(num_accepted, emitted_ids, target_hidden)
        self.inner.on_verified(num_accepted, emitted_ids, target_hidden)

    def _allowed(self, drafted: list[int], more: list[int]) -> int:
        """How many of `more`, after `drafted`, the grammar allows."""
        return self.grammar.allowed_length(drafted + more) - len(drafted)

    def propose(self, context_ids: list[int], k: int, sampling: SamplingParams, noise: DraftNoise) -> Draft:
        forced, looked = self._now(context_ids)
        tokens = list(forced[:k])  # 1. forced
        probs: Optional[list[torch.Tensor]] = None  # a [V] row per token once the entry's proposer drew a draft
        while len(tokens) < k:
            if not tokens and looked:  # 2. a free part
                draft = Draft(looked[:k])
            elif tokens:
                draft = self.lookup.propose(context_ids + tokens, k - len(tokens), sampling, noise)
            else:
                draft = self.inner.propose(context_ids, k, sampling, noise)
            kept = self._allowed(tokens, list(draft.token_ids))
            if not kept:
                break
            if draft.probs is not None:  # drawn at draft positions 0..kept-1: tokens held nothing before it
                probs = list(draft.probs[:kept])
            elif probs is not None:
                probs += _one_hot(draft.token_ids[:kept], probs[0])
            tokens += draft.token_ids[:kept]
            more = self.grammar.forced(tokens)[: k - len(tokens)]  # 3. forced again
            tokens += more
            if probs is not None:
                probs += _one_hot(more, probs[0])
        return Draft(tokens, torch.stack(probs) if probs else None)

    def propose_tree(
        self, context_ids: list[int], n_nodes: int, sampling: SamplingParams, noise: DraftNoise
    ) -> Optional[TokenTree]:
        forced, looked = self._now(context_ids)
        trunk = list(forced[:n_nodes])
        rest = n_nodes - len(trunk)
        tree = None
        if rest > 0 and (trunk or looked):
            tree = tree_of(self.lookup, context_ids + trunk if trunk else context_ids, rest, sampling, noise)
        elif rest > 0:
            tree = tree_of(self.inner, context_ids, rest, sampling, noise)
        tree = _grafted(trunk, self._within_grammar(trunk, tree))
        if tree is None:
            return None
        branch = tree.first_branch()
        more = self.grammar.forced([tree.token_ids[node] for node in branch])[: n_nodes - tree.size]
        return _below(tree, branch[-1], more) if more else tree

    def _within_grammar(self, trunk: list[int], tree: Optional[TokenTree]) -> Optional[TokenTree]:
        """tree (drafted after trunk) without the nodes the grammar refuses and their subtrees; None when empty."""
        if tree is None or not tree.size:
            return None
        paths: list[list[int]] = []
        kept: list[int] = []  # new index of each node, -1 when dropped
        nodes: list[int] = []  # the kept nodes' old indices
        for token, parent in zip(tree.token_ids, tree.parents):
            path = (paths[parent] if parent >= 0 else []) + [token]
            paths.append(path)
            ok = (parent < 0 or kept[parent] >= 0) and self._allowed(trunk, path) == len(path)
            kept.append(len(nodes) if ok else -1)
            if ok:
                nodes.append(len(kept) - 1)
        if not nodes:
            return None
        parents = [kept[tree.parents[i]] if tree.parents[i] >= 0 else -1 for i in nodes]
        return TokenTree([tree.token_ids[i] for i in nodes], parents)


def _one_hot(tokens: list[int], like: torch.Tensor) -> list[torch.Tensor]:
    """A [V] row of like's dtype and device per token, 1 at its token."""
    rows = torch.zeros(len(tokens), like.shape[-1], dtype=like.dtype, device=like.device)
    rows[torch.arange(len(tokens)), torch.tensor(tokens, dtype=torch.long)] = 1.0
    return list(rows)


def _grafted(trunk: list[int], tree: Optional[TokenTree]) -> Optional[TokenTree]:
    """`tree` hanging from the last token of the chain `trunk` (the chain alone without a tree; None: neither)."""
    if not trunk:
        return tree
    chain = TokenTree.chain(trunk)
    return chain if tree is None else _below(chain, len(trunk) - 1, tree.token_ids, tree.parents)


def _below(tree: TokenTree, node: int, token_ids: list[int], parents: Optional[list[int]] = None) -> TokenTree:
    """tree with the nodes (token_ids, parents) added below `node`: a part's root (-1) hangs from node; parents=None
    is a chain."""
    parents = list(range(-1, len(token_ids) - 1)) if parents is None else parents
    shift = tree.size
    return TokenTree(tree.token_ids + list(token_ids), tree.parents + [node if p < 0 else p + shift for p in parents])
