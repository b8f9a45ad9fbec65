"""The speculative decoding loop, over token ids only, one StepEvent per target forward: the policy plans the step
(policy.py: plain, a chain of K or a tree of N nodes) → the step runs it (step.py: draft → forward → verify →
advance → event) → the policy learns its outcome. Run (run.py) carries the answer's own state from step to step."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Optional

import torch

from localspec.config import SamplingParams, SpecConfig
from localspec.proposers.base import Proposer
from localspec.runtime.model_runner import ModelRunner
from localspec.runtime.plan import plan_forward
from localspec.verify import get_verifier

from .events import StepEvent
from .policy import Controllers, StepPolicy
from .run import Run
from .step import step


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
        run, policy = self._start(prompt_ids, sampling, spec, None if spec.proposer == "none" else proposer)
        try:
            with self.lock:
                self._prefill(run, prompt_ids)
                yield from self._steps(run, policy, cancel)
        except Exception as exc:  # a model that breaks mid-answer ends the answer with a message, not a traceback
            yield StepEvent.finished_early(run.snapshot(), "error", f"generation failed: {type(exc).__name__}: {exc}")

    def _start(
        self, prompt_ids: list[int], sampling: SamplingParams, spec: SpecConfig, proposer: Optional[Proposer]
    ) -> tuple[Run, StepPolicy]:
        _, verify = get_verifier(spec.sampler, self.target.device)
        device, limit = self.target.device, self.max_context
        run = Run.start(prompt_ids, sampling, spec, proposer, verify, device, limit)
        return run, StepPolicy(self.controllers, spec, proposer, run.max_k, self.target.supports_tree)

    def _prefill(self, run: Run, prompt_ids: list[int]) -> None:
        """Cache the prompt but its last token (whose logits are the first verified position); start the proposer."""
        self.target.reset()
        started = time.perf_counter()
        cached = prompt_ids[:-1]  # its logits are never read (logits_to_keep 0)
        hidden = self.target.extend(cached, run.wants_hidden, 0, run.feature_layers).hidden if cached else None
        if run.proposer is not None:
            run.proposer.begin(list(prompt_ids), hidden)
        run.stats = replace(run.stats, prefill_s=time.perf_counter() - started)

    def _steps(self, run: Run, policy: StepPolicy, cancel: Optional[threading.Event]) -> Iterator[StepEvent]:
        while run.produced < run.max_new:
            if cancel is not None and cancel.is_set():
                yield StepEvent.finished_early(run.snapshot(), "cancelled")
                return
            event = step(self.target, run, policy.plan(run), policy, self.stop_token_ids)
            if event is None:  # the proposer drafted no tree: this step drafts a chain
                event = step(self.target, run, policy.plan(run, trees=False), policy, self.stop_token_ids)
            yield event
            if event.finished:
                return
