"""One step of the engine loop, for any plan (plan.py), in five phases:

1. draft    the proposer drafts the plan's chain or tree (drafts.py); a plain step drafts nothing
2. forward  one target forward over the pending token and every draft (a tree under its tree mask)
3. verify   the rejection sampler (chain) or the tree walk keeps what the target accepts, in one host read
4. advance  the cache keeps the accepted rows; the tokens up to a stop token are emitted; the proposer is told
5. event    the policy learns the outcome; the statistics and the StepEvent carry what the step did
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Optional

import torch

from localspec.runtime.model_runner import ModelRunner
from localspec.runtime.timing import synced_clock

from .drafts import Draft, Verdict, draft_chain, draft_tree, read_top_logprobs, verify_chain, verify_tree_draft
from .events import FinishReason, StepEvent, TokenEvent
from .plan import StepOutcome, StepPlan
from .policy import StepPolicy
from .run import Run

NON_FINITE = "the target produced NaN or infinite logits; the answer was stopped"


def step(
    target: ModelRunner, run: Run, plan: StepPlan, policy: StepPolicy, stop_token_ids: frozenset[int]
) -> Optional[StepEvent]:
    """Run `plan`; None when it is a tree and the proposer drafted none (the loop then plans without trees)."""
    # 1. draft
    room = run.room
    draft = draft_tree(run, plan.size) if plan.shape == "tree" else draft_chain(run, plan.size)
    if draft is None:
        return None

    # 2. forward
    device, prefix_len = target.device, len(target.tokens)
    wants, layers = run.wants_hidden, run.feature_layers
    started = synced_clock(device)
    if draft.tree is not None:
        forward = target.extend_tree(run.pending, draft.tree, want_hidden=wants, feature_layers=layers)
    else:
        forward = target.extend([run.pending] + draft.token_ids, want_hidden=wants, feature_layers=layers)
    scored = synced_clock(device)  # the forward has finished: the split is right on a GPU

    # 3. verify
    if draft.tree is not None:
        verdict = verify_tree_draft(run, forward.logits, draft.tree)
    else:
        verdict = verify_chain(run, forward.logits, draft)
    if not verdict.finite:
        return StepEvent.finished_early(run.snapshot(), "error", NON_FINITE, drafted=draft.drafted, plan=plan)
    tokens = verdict.tokens
    if run.sampling.top_logprobs:  # asked for: a second read, of the emitted positions only
        read = read_top_logprobs(forward.logits[verdict.rows], run, [token.token_id for token in tokens])
        tokens = [replace(token, logprob=own, top_logprobs=top) for token, (own, top) in zip(tokens, read)]
    sampler_s = time.perf_counter() - scored

    # 4. advance
    tokens, finish_reason = advance(target, run, draft, verdict, tokens, prefix_len, forward.hidden, stop_token_ids)

    # 5. event
    depth = draft.tree.max_depth if draft.tree is not None else None
    outcome = StepOutcome(
        draft.drafted,
        verdict.num_accepted,
        draft.propose_s,
        scored - started,
        sampler_s,
        room,
        draft.whole,
        depth,
        verdict.first_branch,
    )
    reading = policy.observe(plan, outcome)
    stats = run.stats
    if reading is not None:
        stats = replace(stats, k=reading.k, paused=reading.paused)
        if reading.predicted_speedup is not None:
            stats = replace(stats, predicted_speedup=reading.predicted_speedup)
    run.stats = stats.after_step(
        outcome.drafted, outcome.num_accepted, len(tokens), outcome.propose_s, outcome.score_s, sampler_s, depth
    )
    return step_event(tokens, plan, outcome, run, finish_reason)


def advance(
    target: ModelRunner,
    run: Run,
    draft: Draft,
    verdict: Verdict,
    tokens: list[TokenEvent],
    prefix_len: int,
    hidden: Optional[torch.Tensor],  # [rows, F] the verify forward's features, when the proposer wants them
    stop_token_ids: frozenset[int],
) -> tuple[list[TokenEvent], Optional[FinishReason]]:
    """Keep what the target accepted, up to a stop token; tell the proposer. Returns the emitted tokens' events and
    why the answer finished (None: it goes on)."""
    if draft.tree is not None:
        target.keep_path(prefix_len, verdict.rows)  # the cache compacted to the accepted path
    else:
        target.crop(len(target.tokens) - (draft.drafted - verdict.num_accepted))  # drop the rejected drafts
    tokens, stopped = cut_at_stop(tokens, stop_token_ids)
    emitted = [token.token_id for token in tokens]
    run.produced += len(emitted)
    finish_reason = "stop" if stopped else "length" if run.produced >= run.max_new else None
    run.context.extend(emitted)
    if run.proposer is not None and finish_reason is None:
        kept = hidden[verdict.rows] if run.wants_hidden else None  # [num_accepted + 1, F]
        run.proposer.on_verified(verdict.num_accepted, emitted, kept)
    run.pending = emitted[-1]
    return tokens, finish_reason


def cut_at_stop(tokens: list[TokenEvent], stop_token_ids: frozenset[int]) -> tuple[list[TokenEvent], bool]:
    """The tokens up to and including the first stop token, and whether there was one."""
    for i, token in enumerate(tokens):
        if token.token_id in stop_token_ids:
            return tokens[: i + 1], True
    return tokens, False


def step_event(
    tokens: list[TokenEvent], plan: StepPlan, outcome: StepOutcome, run: Run, finish_reason: Optional[FinishReason]
) -> StepEvent:
    """The event of one step that kept `tokens`: its plan, its time split, its draft counts and the answer's
    statistics."""
    return StepEvent(
        tuple(tokens),
        outcome.propose_s * 1e6,
        outcome.score_s * 1e6,
        outcome.sampler_s * 1e6,
        propose_token_num=outcome.drafted,
        accept_token_num=outcome.num_accepted,
        stats=run.snapshot(),
        finished=finish_reason is not None,
        finish_reason=finish_reason,
        plan=plan,
    )
