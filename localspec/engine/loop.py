"""The speculative decoding loop, over token ids only, one StepEvent per target forward. The loop owns each step's
three phases, in one direction:

1. plan     the policy plans (policy.py: plain, a chain of K or a tree of N nodes) and the proposer drafts it
            (drafts.py); a tree plan whose proposer drafts no tree here becomes the policy's chain plan
2. step     the step runs the draft (step.py: forward → verify → advance) and returns what it did
3. observe  the policy learns the outcome, the answer's statistics fold it in (Run.record), the event carries both

Run (run.py) carries the answer's own state from step to step."""

from __future__ import annotations

import threading
import time
from collections.abc import Generator, Iterator, Sequence
from typing import Optional

import torch

from localspec.config import SamplingParams, SpecConfig
from localspec.proposers.base import Proposer
from localspec.runtime.logits_processors import TargetProcessor
from localspec.runtime.model_runner import ModelRunner
from localspec.runtime.plan import plan_forward
from localspec.verify import get_verifier

from .drafts import Draft, draft_for
from .events import EngineEvent, PrefillProgress, StepEvent
from .plan import StepPlan
from .policy import Controllers, StepPolicy
from .run import Run
from .step import step
from .threads import ThreadGovernor

PREFILL_CHUNK = 512  # prompt tokens per prefill forward: a cancel is looked at, and progress told, between them


class Engine:
    """Pairs a target model with proposers. One answer at a time (the caller serialises requests)."""

    def __init__(
        self,
        target_model: torch.nn.Module,
        stop_token_ids: set[int] | frozenset[int] = frozenset(),
        exact: bool = False,  # the target's forwards in the exact setup (runtime/plan.py)
    ) -> None:
        self.target = ModelRunner(target_model, plan=plan_forward(target_model, exact=exact))
        self.stop_token_ids = frozenset(stop_token_ids)
        self.lock = threading.Lock()
        self.controllers = Controllers()  # measured costs and acceptance, kept across answers
        # the forwards' thread count where the plan lets it follow the load (threads.py), else torch's as set
        follow = self.target.plan.threads.value == "follow load"
        self.governor = ThreadGovernor(torch.get_num_threads()) if follow else None
        self._owed: Optional[int] = None  # the caller's thread count while the governor holds another

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
        processors: Sequence[TargetProcessor] = (),
    ) -> Iterator[EngineEvent]:
        """Answer prompt_ids, one StepEvent per target forward, after a PrefillProgress between the prefill's forwards
        of a prompt longer than one (events.py). proposer None (or spec.proposer 'none') is plain
        autoregressive decoding through the same loop: the baseline every speedup is measured against. processors:
        what changes the target's distribution at every position (runtime/logits_processors.py), fresh for this
        answer."""
        run, policy = self._start(
            prompt_ids, sampling, spec, None if spec.proposer == "none" else proposer, tuple(processors)
        )
        try:
            with self.lock:
                self._give_back_threads()  # an answer left unfinished (its stream dropped) may still hold them
                if self.governor is not None:
                    self.governor.configured = torch.get_num_threads()  # the caller's: the most it uses
                if not (yield from self._prefill(run, prompt_ids, cancel)):
                    yield StepEvent.finished_early(run.snapshot(), "cancelled")
                    return
                yield from self._steps(run, policy, cancel)
        except Exception as exc:  # a model that breaks mid-answer ends the answer with a message, not a traceback
            yield StepEvent.finished_early(run.snapshot(), "error", f"generation failed: {type(exc).__name__}: {exc}")
        finally:
            self._give_back_threads()

    def _follow_load(self) -> None:
        """Before a forward: the governor's thread count, where the plan lets it follow the load."""
        if self.governor is not None:
            count = self.governor.threads()
            if count != torch.get_num_threads():
                self._owed = torch.get_num_threads() if self._owed is None else self._owed
                torch.set_num_threads(count)

    def _give_back_threads(self) -> None:
        if self._owed is not None:
            torch.set_num_threads(self._owed)
            self._owed = None

    def _start(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        spec: SpecConfig,
        proposer: Optional[Proposer],
        processors: tuple[TargetProcessor, ...] = (),
    ) -> tuple[Run, StepPolicy]:
        _, verify = get_verifier(spec.sampler, self.target.device)
        device, limit = self.target.device, self.max_context
        run = Run.start(prompt_ids, sampling, spec, proposer, verify, device, limit, processors)
        return run, StepPolicy(self.controllers, spec, proposer, run.max_k, self.target.supports_tree)

    def _prefill(
        self, run: Run, prompt_ids: list[int], cancel: Optional[threading.Event] = None
    ) -> Generator[PrefillProgress, None, bool]:
        """Cache the prompt but its last token (whose logits are the first verified position); start the proposer.
        A long prompt runs in forwards of PREFILL_CHUNK tokens, with a PrefillProgress after each and one more once
        the prompt is read; returns False when `cancel` was set during one of them (the rest is never run)."""
        self.target.reset()
        started = time.perf_counter()
        cached = prompt_ids[:-1]  # its logits are never read (logits_to_keep 0)
        total, chunk = len(prompt_ids), PREFILL_CHUNK
        hiddens = []
        for start in range(0, len(cached), chunk):
            piece = cached[start : start + chunk]
            self._follow_load()
            hiddens.append(self.target.extend(piece, run.wants_hidden, 0, run.feature_layers).hidden)
            if start + chunk < len(cached):
                if cancel is not None and cancel.is_set():
                    return False
                yield PrefillProgress(start + chunk, total, time.perf_counter() - run.started)
        hidden = (hiddens[0] if len(hiddens) == 1 else torch.cat(hiddens)) if run.wants_hidden and hiddens else None
        if run.proposer is not None:
            run.proposer.begin(list(prompt_ids), hidden)
        run.prefilled(time.perf_counter() - started)
        if len(cached) > chunk:  # the last token is read by the first step, which follows at once
            yield PrefillProgress(total, total, time.perf_counter() - run.started)
        return True

    def _steps(self, run: Run, policy: StepPolicy, cancel: Optional[threading.Event]) -> Iterator[StepEvent]:
        while run.produced < run.max_new:
            if cancel is not None and cancel.is_set():
                yield StepEvent.finished_early(run.snapshot(), "cancelled")
                return
            # 1. plan
            self._follow_load()
            plan, draft = planned_draft(run, policy)
            # 2. step
            result = step(self.target, run, draft, self.stop_token_ids)
            # 3. observe (a step whose logits were not finite teaches nothing and ends the answer)
            counted = result.error is None
            run.record(result.outcome, policy.observe(plan, result.outcome) if counted else None, counted)
            event = result.event(plan, run)
            yield event
            if event.finished:
                return


def planned_draft(run: Run, policy: StepPolicy) -> tuple[StepPlan, Draft]:
    """This step's plan and its draft. A tree plan whose proposer drafts no tree here becomes the policy's chain
    plan (decided only then: choosing a chain moves the adaptive controller's on/off count)."""
    plan = policy.plan(run)
    draft = draft_for(run, plan)
    if draft is None:
        plan = policy.chain_plan(run)
        draft = draft_for(run, plan)
        assert draft is not None  # a chain or plain plan always drafts (maybe nothing)
    return plan, draft
