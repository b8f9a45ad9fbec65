"""The draft phase of a step: what the proposer drafts for a plan. Chain: up to K tokens (with their distributions,
or one-hot); tree: a token tree of up to N nodes within the token budget's depth (its nodes are one-hot drafts to
the verifier). Nothing here verifies (verify/) or writes the answer's statistics (Run.record)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

import torch

from localspec.proposers.base import DraftNoise
from localspec.runtime.tree import TokenTree

from .plan import StepPlan
from .run import Run


@dataclass(frozen=True)
class Draft:
    """What the proposer drafted this step: a chain of token ids (none for a plain step), or a tree."""

    token_ids: list[int]  # a chain's drafts
    probs: Optional[torch.Tensor]  # [1, K, V] a chain's draft distributions; None = one-hot
    tree: Optional[TokenTree]  # a tree step's tree, within the token budget's depth
    propose_s: float
    whole: bool = True  # the token budget did not cut the tree
    dropped: bool = False  # the proposer's chain had NaN / infinite probabilities: dropped, the step runs plain

    @property
    def drafted(self) -> int:
        return self.tree.size if self.tree is not None else len(self.token_ids)


def draft_for(run: Run, plan: StepPlan) -> Optional[Draft]:
    """The plan's draft; None when the plan is a tree and the proposer drafted none here."""
    return draft_tree(run, plan.size) if plan.shape == "tree" else draft_chain(run, plan.size)


def draft_noise(run: Run) -> DraftNoise:
    """The noise this step's sampled drafts are drawn with: with a seed, each output position's own (the target's
    draw there), so soft drafts agree with it as often as their distribution allows; else the answer's generator."""
    seeded = run.sampling.seeded and not run.sampling.greedy
    return DraftNoise(run.generator, run.sampling.seed if seeded else None, run.produced)


def draft_chain(run: Run, asked: int) -> Draft:
    """Up to `asked` draft tokens (none for a plain step). A draft with NaN probabilities is dropped."""
    started = time.perf_counter()
    token_ids, probs, dropped = [], None, False
    if run.proposer is not None and asked > 0:
        draft = run.proposer.propose(run.context, asked, run.sampling, draft_noise(run))
        token_ids = list(draft.token_ids[:asked])
        if draft.probs is not None and token_ids:
            probs = draft.probs[: len(token_ids)].unsqueeze(0)  # [1, K, V]
            if not bool(torch.isfinite(probs).all()):  # a NaN draft: this step runs plain, and is counted
                token_ids, probs, dropped = [], None, True
    return Draft(token_ids, probs, None, time.perf_counter() - started, dropped=dropped)


def draft_tree(run: Run, n_nodes: int) -> Optional[Draft]:
    """A tree of up to n_nodes, cut to the depth the token budget allows; None when the proposer drafted none."""
    started = time.perf_counter()
    noise = draft_noise(run)
    tree = run.proposer.propose_tree(run.context, n_nodes, run.sampling, noise) if run.proposer else None
    if tree is None or tree.size == 0:
        return None
    whole = tree.max_depth <= run.room
    tree = tree.within_depth(run.room)
    return Draft([], None, tree, time.perf_counter() - started, whole)
