"""The speculative decoding loop, over token ids only, one StepEvent per target forward: draft K tokens → score K+1
positions in one target forward → rejection-sample → roll the cache back to what was kept → tell the proposer.
Run (step.py) carries the answer's state from step to step."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Optional

import torch

from localspec.config import SamplingParams, SpecConfig
from localspec.proposers.base import Proposer
from localspec.verify import VerifyOutput, get_verifier
from localspec.verify.one_hot import verify_one_hot
from localspec.verify.types import position_draws

from .events import StepEvent
from .model_runner import FAST, ModelRunner, exact_setup
from .step import (
    NON_FINITE,
    Controllers,
    Proposal,
    Run,
    StepOutcome,
    cut_at_stop,
    read_top_logprobs,
    step_event,
    token_events,
)
from .timing import synced_clock
from .tree_step import tree_step


class Engine:
    """Pairs a target model with proposers. One answer at a time (the caller serialises requests)."""

    def __init__(
        self,
        target_model: torch.nn.Module,
        stop_token_ids: set[int] | frozenset[int] = frozenset(),
        exact: bool = False,  # the target's forwards in the exact setup (model_runner.py exact_setup)
    ) -> None:
        self.target = ModelRunner(target_model, setup=exact_setup(target_model.dtype) if exact else FAST)
        self.stop_token_ids = frozenset(stop_token_ids)
        self.lock = threading.Lock()
        self.controllers = Controllers()  # measured costs and acceptance, kept across answers

    @property
    def max_context(self) -> int:
        return self.target.max_context

    def generate(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        spec: SpecConfig,
        proposer: Optional[Proposer] = None,
        cancel: Optional[threading.Event] = None,
    ) -> Iterator[StepEvent]:
        """Answer prompt_ids, one StepEvent per target forward. proposer None (or spec.proposer 'none') is plain
        autoregressive decoding through the same loop: the baseline every speedup is measured against."""
        run = self._start(prompt_ids, sampling, spec, None if spec.proposer == "none" else proposer)
        try:
            with self.lock:
                self._prefill(run, prompt_ids)
                yield from self._steps(run, cancel)
        except Exception as exc:  # a model that breaks mid-answer ends the answer with a message, not a traceback
            yield StepEvent.finished_early(run.snapshot(), "error", f"generation failed: {type(exc).__name__}: {exc}")

    def _start(
        self, prompt_ids: list[int], sampling: SamplingParams, spec: SpecConfig, proposer: Optional[Proposer]
    ) -> Run:
        self.sampler_name, verify = get_verifier(spec.sampler, self.target.device)
        device, limit = self.target.device, self.max_context
        return Run.start(prompt_ids, sampling, spec, proposer, verify, device, limit, self.controllers)

    def _prefill(self, run: Run, prompt_ids: list[int]) -> None:
        """Cache the prompt but its last token (whose logits are the first verified position); start the proposer."""
        self.target.reset()
        started = time.perf_counter()
        cached = prompt_ids[:-1]  # its logits are never read (logits_to_keep 0)
        hidden = self.target.extend(cached, run.wants_hidden, 0, run.feature_layers).hidden if cached else None
        if run.proposer is not None:
            run.proposer.begin(list(prompt_ids), hidden)
        run.stats = replace(run.stats, prefill_s=time.perf_counter() - started)

    def _steps(self, run: Run, cancel: Optional[threading.Event]) -> Iterator[StepEvent]:
        while run.produced < run.max_new:
            if cancel is not None and cancel.is_set():
                yield StepEvent.finished_early(run.snapshot(), "cancelled")
                return
            event = tree_step(self.target, run, self.stop_token_ids) or self._chain_step(run)
            yield event
            if event.finished:
                return

    def _chain_step(self, run: Run) -> StepEvent:
        outcome = self._verify(run, self._draft(run))
        if not outcome.verdict.finite:
            return StepEvent.finished_early(run.snapshot(), "error", NON_FINITE, drafted=outcome.proposal.k)
        return self._advance(run, outcome)

    def _draft(self, run: Run) -> Proposal:
        budget_k, asked = run.choose_k()
        started = time.perf_counter()
        token_ids, probs = [], None
        if run.proposer is not None and asked > 0:
            draft = run.proposer.propose(run.context, asked, run.sampling, run.generator)
            token_ids = list(draft.token_ids[:asked])
            if draft.probs is not None and token_ids:
                probs = draft.probs[: len(token_ids)].unsqueeze(0)  # [1, K, V]
                if not bool(torch.isfinite(probs).all()):  # a NaN draft: this step runs plain, and is counted
                    token_ids, probs = [], None
                    run.stats = replace(run.stats, dropped_drafts=run.stats.dropped_drafts + 1)
        return Proposal(budget_k, asked, token_ids, probs, time.perf_counter() - started)

    def _verify(self, run: Run, proposal: Proposal) -> StepOutcome:
        """One target forward over the pending token and the K drafts, the rejection sampler, one host read (and the
        emitted positions' top log-probabilities in a second, when asked for)."""
        device, k = self.target.device, proposal.k
        started = synced_clock(device)
        forward = self.target.extend(
            [run.pending] + proposal.token_ids, want_hidden=run.wants_hidden, feature_layers=run.feature_layers
        )
        logits = forward.logits.unsqueeze(0)  # [1, K+1, V]
        scored = synced_clock(device)  # the forward has finished: the split is right on a GPU
        draws = (
            None
            if run.sampling.greedy
            else position_draws(run.sampling.seed, run.produced, k, logits.shape[-1], device)
        )
        drafts = torch.tensor([proposal.token_ids], dtype=torch.long, device=device).view(1, k)
        one_hot = proposal.probs is None and not run.sampling.greedy  # sampled one-hot drafts: the target's own draw
        verify = verify_one_hot if one_hot else run.verify
        result = verify(logits, drafts, proposal.probs, run.sampling, draws)
        finite = torch.isfinite(logits).all()
        verdict = VerifyOutput.from_host(result.to_host(finite), k)  # the step's one host read
        top = None
        if run.sampling.top_logprobs and verdict.finite:  # asked for: a second read, of the emitted positions only
            top = read_top_logprobs(forward.logits, run.sampling, verdict.num_accepted + 1)
        return StepOutcome(proposal, verdict, forward.hidden, scored - started, time.perf_counter() - scored, top)

    def _advance(self, run: Run, outcome: StepOutcome) -> StepEvent:
        """Keep what the target accepted, up to a stop token, and tell the proposer, the controller and the stats."""
        proposal, verdict = outcome.proposal, outcome.verdict
        self.target.crop(len(self.target.tokens) - (proposal.k - verdict.num_accepted))  # drop the rejected drafts
        tokens, stopped = cut_at_stop(token_events(outcome), self.stop_token_ids)
        emitted = [token.token_id for token in tokens]
        run.produced += len(emitted)
        finish_reason = "stop" if stopped else "length" if run.produced >= run.max_new else None
        run.context.extend(emitted)
        if run.proposer is not None and finish_reason is None:
            hidden = outcome.hidden[: verdict.num_accepted + 1] if run.wants_hidden else None
            run.proposer.on_verified(verdict.num_accepted, emitted, hidden)
        run.pending = emitted[-1]
        run.observe(outcome, len(emitted))
        return step_event(tokens, outcome, run.snapshot(), finish_reason)
