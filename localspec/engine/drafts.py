"""The two drafting shapes' own phases of a step (step.py runs the rest, shared): the draft, and the verify that
turns the target's forward into the emitted tokens' events.

Chain: the proposer drafts up to K tokens (with their distributions, or one-hot); the rejection sampler keeps a
prefix and emits a resampled or bonus token. Tree: the proposer drafts a token tree of N nodes within the token
budget's depth; verify/tree.py walks the longest accepted path. Tree nodes are one-hot drafts to the verifier."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Optional, Union

import torch

from localspec.proposers.base import DraftNoise
from localspec.runtime.sampling import top_logprobs
from localspec.runtime.tree import TokenTree
from localspec.verify import VerifyOutput
from localspec.verify.one_hot import verify_one_hot
from localspec.verify.tree import TreeVerdict, tree_position_draws, verify_tree
from localspec.verify.types import HostVerdict, position_draws

from .events import TokenEvent
from .run import Run

TopLogprobs = tuple[tuple[int, float], ...]  # (token id, log-probability), most likely first


@dataclass(frozen=True)
class Draft:
    """What the proposer drafted this step: a chain of token ids (none for a plain step), or a tree."""

    token_ids: list[int]  # a chain's drafts
    probs: Optional[torch.Tensor]  # [1, K, V] a chain's draft distributions; None = one-hot
    tree: Optional[TokenTree]  # a tree step's tree, within the token budget's depth
    propose_s: float
    whole: bool = True  # the token budget did not cut the tree

    @property
    def drafted(self) -> int:
        return self.tree.size if self.tree is not None else len(self.token_ids)


@dataclass(frozen=True)
class Verdict:
    """What the target kept, on the host: the emitted tokens' events and the forward's rows on the kept path."""

    finite: bool
    tokens: list[TokenEvent]
    num_accepted: int
    rows: Union[slice, list[int]]  # rows of the verify forward that the emitted tokens came from
    first_branch: Optional[tuple[int, int]] = None  # a greedy tree's first branch: (its length, how many kept)


NOT_FINITE = Verdict(False, [], 0, [])


def draft_chain(run: Run, asked: int) -> Draft:
    """Up to `asked` draft tokens (none for a plain step). A draft with NaN probabilities is dropped and counted."""
    started = time.perf_counter()
    token_ids, probs = [], None
    if run.proposer is not None and asked > 0:
        draft = run.proposer.propose(run.context, asked, run.sampling, draft_noise(run))
        token_ids = list(draft.token_ids[:asked])
        if draft.probs is not None and token_ids:
            probs = draft.probs[: len(token_ids)].unsqueeze(0)  # [1, K, V]
            if not bool(torch.isfinite(probs).all()):  # a NaN draft: this step runs plain, and is counted
                token_ids, probs = [], None
                run.stats = replace(run.stats, dropped_drafts=run.stats.dropped_drafts + 1)
    return Draft(token_ids, probs, None, time.perf_counter() - started)


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


def draft_noise(run: Run) -> DraftNoise:
    """The noise this step's sampled drafts are drawn with: with a seed, each output position's own (the target's
    draw there), so soft drafts agree with it as often as their distribution allows; else the answer's generator."""
    seeded = run.sampling.seeded and not run.sampling.greedy
    return DraftNoise(run.generator, run.sampling.seed if seeded else None, run.produced)


def verify_chain(run: Run, logits: torch.Tensor, draft: Draft) -> Verdict:
    """The rejection sampler over the verify forward's logits [K+1, V], in the step's one host read."""
    device, k = logits.device, draft.drafted
    logits = logits.unsqueeze(0)  # [1, K+1, V]
    # every draw keyed to (seed, output position): a seeded answer does not depend on K, trees or adaptive choices
    draws = (
        None if run.sampling.greedy else position_draws(run.sampling.seed, run.produced, k, logits.shape[-1], device)
    )
    drafts = torch.tensor([draft.token_ids], dtype=torch.long, device=device).view(1, k)
    # sampled, the target's own draw decides one-hot drafts, and with a seed every draft (the answer is then plain
    # seeded sampling's); soft drafts without a seed take the full rejection sampler, which keeps more of them
    own_draw = not run.sampling.greedy and (draft.probs is None or run.sampling.seeded)
    verify = verify_one_hot if own_draw else run.verify
    result = verify(logits, drafts, draft.probs, run.sampling, draws)
    finite = torch.isfinite(logits).all()
    verdict = VerifyOutput.from_host(result.to_host(finite), k)  # the step's one host read
    if not verdict.finite:
        return NOT_FINITE
    tokens = token_events(verdict, draft.token_ids)
    return Verdict(True, tokens, verdict.num_accepted, slice(0, verdict.num_accepted + 1))


def verify_tree_draft(run: Run, logits: torch.Tensor, tree: TokenTree) -> Verdict:
    """The longest accepted path of the tree, from the verify forward's logits [N+1, V]."""
    draws = (
        None
        if run.sampling.greedy
        else tree_position_draws(run.sampling.seed, run.produced, tree, logits.shape[-1], logits.device)
    )
    verdict = verify_tree(logits, tree, run.sampling, draws)
    if not verdict.finite:
        return NOT_FINITE
    first_branch = None
    if run.sampling.greedy:  # sampled, a tree's one-hot siblings are accepted unlike the chain's p/q test
        kept = next((i for i, b in enumerate(verdict.branches) if b != 0), len(verdict.branches))
        first_branch = (len(tree.first_branch()), kept)
    return Verdict(True, tree_token_events(verdict, tree), verdict.num_accepted, verdict.rows, first_branch)


def token_events(verdict: HostVerdict, draft_ids: list[int]) -> list[TokenEvent]:
    """One TokenEvent per emitted token: the accepted drafts, then the resampled token (a draft was rejected), the
    bonus token (every draft was kept) or the target's own token (nothing was drafted)."""
    n, k = verdict.num_accepted, len(draft_ids)
    tokens = [
        TokenEvent.accepted(token_id, verdict.target_probs_of_drafts[i], verdict.draft_probs_of_drafts[i])
        for i, token_id in enumerate(verdict.emitted[:n])
    ]
    last = verdict.emitted[n]
    if n < k:
        tokens.append(
            TokenEvent.resampled(
                last,
                verdict.target_prob_of_last,
                draft_ids[n],
                verdict.target_probs_of_drafts[n],
                verdict.draft_probs_of_drafts[n],
            )
        )
    else:
        tokens.append(TokenEvent(last, "bonus" if k > 0 else "target", verdict.target_prob_of_last))
    return tokens


def tree_token_events(verdict: TreeVerdict, tree: TokenTree) -> list[TokenEvent]:
    """The accepted nodes (with their branch), then the recovered token as 'resampled' (naming the first child the
    target rejected) or the 'bonus' token at a leaf. Tree nodes are one-hot drafts to the verifier: p_draft 1."""
    n = verdict.num_accepted
    tokens = [
        TokenEvent(token_id, "accepted", p, 1.0, branch=branch)
        for token_id, p, branch in zip(verdict.emitted[:n], verdict.target_probs[:n], verdict.branches)
    ]
    last, p_last = verdict.emitted[n], verdict.target_probs[n]
    if verdict.rejected is not None:
        tokens.append(TokenEvent.resampled(last, p_last, verdict.rejected[0], verdict.rejected[1], 1.0))
    else:
        tokens.append(TokenEvent(last, "bonus" if tree.size else "target", p_last))
    return tokens


def read_top_logprobs(logits: torch.Tensor, run: Run) -> list[TopLogprobs]:
    """Each row's top-n (n = sampling.top_logprobs) from the kept rows of the verify forward's logits [rows, V], in
    one host read."""
    n = min(run.sampling.top_logprobs, logits.shape[-1])
    values, ids = top_logprobs(logits, run.sampling, n)
    packed = torch.cat([ids.to(torch.float64), values.to(torch.float64)], dim=-1).tolist()  # [rows, 2n]
    return [tuple((int(row[i]), row[n + i]) for i in range(n)) for row in packed]
