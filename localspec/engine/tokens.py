"""The verify phase, engine side: verify/ decides what the target kept; this turns its verdict into the emitted
tokens' events (kinds, probabilities, a tree node's branch, top log-probabilities on request)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional, Union

import torch

from localspec.config import SamplingParams
from localspec.runtime.sampling import all_finite, chosen_and_top_logprobs
from localspec.runtime.tree import TokenTree
from localspec.verify import Verifier
from localspec.verify.chain import verify_chain
from localspec.verify.tree import TreeVerdict, verify_tree_at
from localspec.verify.types import HostVerdict

from .drafts import Draft
from .events import TokenEvent

TopLogprobs = tuple[tuple[int, float], ...]  # (token id, log-probability), most likely first


@dataclass(frozen=True)
class Verdict:
    """What the target kept, on the host: the emitted tokens' events and the forward's rows on the kept path."""

    tokens: list[TokenEvent]
    num_accepted: int
    rows: Union[slice, list[int]]  # rows of the verify forward that the emitted tokens came from
    first_branch: Optional[tuple[int, int]] = None  # a greedy tree's first branch: (its length, how many kept)


def judge(
    logits: torch.Tensor,  # [rows, V] the verify forward's
    draft: Draft,
    sampling: SamplingParams,
    start: int,  # the output position of row 0
    rejection_sampler: Verifier,
    raw: Optional[torch.Tensor] = None,  # [rows, V] the forward's own logits, when `logits` are processed ones
) -> Optional[Verdict]:
    """The verdict on the step's draft (chain or tree); None when the forward's logits held NaN / inf (a processor's
    -inf, a forbidden token, is not a fault: the forward's own logits are the ones checked)."""
    finite = all_finite(raw) if raw is not None and raw is not logits else None
    if draft.tree is not None:
        return _tree_verdict(verify_tree_at(logits, draft.tree, sampling, start, finite), draft.tree, sampling)
    found = verify_chain(logits, draft.token_ids, draft.probs, sampling, start, rejection_sampler, finite)
    if found is None:
        return None
    return Verdict(token_events(found, draft.token_ids), found.num_accepted, slice(0, found.num_accepted + 1))


def _tree_verdict(verdict: TreeVerdict, tree: TokenTree, sampling: SamplingParams) -> Optional[Verdict]:
    if not verdict.finite:
        return None
    first_branch = None
    if sampling.greedy:  # sampled, a tree's one-hot siblings are accepted unlike the chain's p/q test
        kept = next((i for i, b in enumerate(verdict.branches) if b != 0), len(verdict.branches))
        first_branch = (len(tree.first_branch()), kept)
    return Verdict(tree_token_events(verdict, tree), verdict.num_accepted, verdict.rows, first_branch)


def with_top_logprobs(tokens: list[TokenEvent], logits: torch.Tensor, sampling: SamplingParams) -> list[TokenEvent]:
    """The tokens with each emitted token's log-probability and its position's top-n (n = sampling.top_logprobs),
    from the kept rows of the verify forward's logits [rows, V] and one log-softmax (so the two agree exactly), in a
    second host read."""
    n = min(sampling.top_logprobs, logits.shape[-1])
    chosen = torch.tensor([token.token_id for token in tokens], dtype=torch.long, device=logits.device)  # [rows]
    own, values, ids = chosen_and_top_logprobs(logits, sampling, chosen, n)
    packed = [own.to(torch.float64).unsqueeze(-1), values.to(torch.float64), ids.to(torch.float64)]
    rows = torch.cat(packed, dim=-1).tolist()  # [rows, 1 + 2n]
    return [
        replace(token, logprob=row[0], top_logprobs=tuple((int(row[1 + n + i]), row[1 + i]) for i in range(n)))
        for token, row in zip(tokens, rows)
    ]


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
