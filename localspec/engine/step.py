"""One step over a drafted plan, in three phases (the loop, loop.py, plans and drafts before and learns after):

1. forward  one target forward over the pending token and every draft (a tree under its tree mask)
2. verify   verify/ keeps what the target accepts, in one host read (tokens.py: the emitted tokens' events)
3. advance  the cache keeps the accepted rows; the tokens up to a stop token are emitted; the proposer is told

It returns what it did (StepResult); it neither teaches the policy nor writes the answer's statistics.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

import torch

from localspec.runtime.logits_processors import apply_processors, chain_paths, commit_processors, tree_paths
from localspec.runtime.model_runner import ModelRunner
from localspec.runtime.timing import synced_clock

from .drafts import Draft
from .events import FinishReason, StepEvent, TokenEvent
from .plan import StepOutcome, StepPlan
from .run import Run
from .tokens import Verdict, judge, with_top_logprobs

NON_FINITE = "the target produced NaN or infinite logits; the answer was stopped"


@dataclass(frozen=True)
class StepResult:
    """What one step emitted and measured; error set (and nothing emitted) when the target's logits were not
    finite."""

    tokens: tuple[TokenEvent, ...]
    finish_reason: Optional[FinishReason]
    outcome: StepOutcome
    error: Optional[str] = None

    def event(self, plan: StepPlan, run: Run) -> StepEvent:
        """The step's event, with the answer's statistics as of now (after Run.record)."""
        if self.error is not None:
            return StepEvent.finished_early(run.snapshot(), "error", self.error, self.outcome.drafted, plan)
        outcome = self.outcome
        return StepEvent(
            self.tokens,
            outcome.propose_s * 1e6,
            outcome.score_s * 1e6,
            outcome.sampler_s * 1e6,
            propose_token_num=outcome.drafted,
            accept_token_num=outcome.num_accepted,
            stats=run.snapshot(),
            finished=self.finish_reason is not None,
            finish_reason=self.finish_reason,
            plan=plan,
        )


def step(target: ModelRunner, run: Run, draft: Draft, stop_token_ids: frozenset[int]) -> StepResult:
    """Verify `draft` (the plan's, drafted by the loop) and advance the answer by what the target kept."""
    room = run.room

    # 1. forward
    device, prefix_len = target.device, len(target.tokens)
    wants, layers = run.wants_hidden, run.feature_layers
    started = synced_clock(device)
    if draft.tree is not None:
        forward = target.extend_tree(run.pending, draft.tree, want_hidden=wants, feature_layers=layers)
    else:
        forward = target.extend([run.pending] + draft.token_ids, want_hidden=wants, feature_layers=layers)
    scored = synced_clock(device)  # the forward has finished: the split is right on a GPU

    # 2. verify (the target's distribution as its processors leave it: a grammar's mask, …)
    logits = forward.logits  # [rows, V]
    if run.processors:
        paths = tree_paths(draft.tree) if draft.tree is not None else chain_paths(draft.token_ids)
        logits = apply_processors(run.processors, logits, paths)
    verdict = judge(logits, draft, run.sampling, run.produced, run.verify, raw=forward.logits)
    depth = draft.tree.max_depth if draft.tree is not None else None
    measured = dict(
        drafted=draft.drafted,
        propose_s=draft.propose_s,
        score_s=scored - started,
        room=room,
        whole=draft.whole,
        depth=depth,
        dropped=draft.dropped,
    )
    if verdict is None:
        outcome = StepOutcome(num_accepted=0, emitted=0, sampler_s=time.perf_counter() - scored, **measured)
        return StepResult((), "error", outcome, NON_FINITE)
    tokens = verdict.tokens
    if run.sampling.top_logprobs:  # asked for: a second read, of the emitted positions only
        tokens = with_top_logprobs(tokens, logits[verdict.rows], run.sampling)
    sampler_s = time.perf_counter() - scored

    # 3. advance
    tokens, finish_reason = advance(target, run, draft, verdict, tokens, prefix_len, forward.hidden, stop_token_ids)
    outcome = StepOutcome(
        num_accepted=verdict.num_accepted,
        emitted=len(tokens),
        sampler_s=sampler_s,
        first_branch=verdict.first_branch,
        **measured,
    )
    return StepResult(tuple(tokens), finish_reason, outcome)


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
    commit_processors(run.processors, emitted)
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
