"""One answer in progress (Run): its settings, where it stands and its statistics, which only its own methods write
(prefilled, record); nothing about how steps are decided (policy.py) or run (step.py)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Optional

import torch

from localspec.config import ConfigError, SamplingParams, SpecConfig
from localspec.proposers.base import Proposer
from localspec.runtime.logits_processors import TargetProcessor
from localspec.runtime.penalties import penalties_for
from localspec.verify import Verifier

from .metrics import StatsSnapshot
from .plan import StepOutcome

if TYPE_CHECKING:
    from .policy import Reading


@dataclass
class Run:
    """One answer in progress: its settings, where it stands, and its statistics."""

    sampling: SamplingParams
    spec: SpecConfig
    proposer: Optional[Proposer]  # None: plain decoding
    verify: Verifier
    generator: torch.Generator
    max_new: int  # the token budget: the request's, capped by the context left
    max_k: int  # draft tokens per step at most (0 without a proposer)
    context: list[int]  # the prompt plus every emitted token
    stats: StatsSnapshot
    processors: tuple[TargetProcessor, ...] = ()  # what changes the target's distribution: penalties, a grammar's mask
    pending: int = 0  # the last known token: its logits are the next verified position
    produced: int = 0
    started: float = field(default_factory=time.perf_counter)

    @classmethod
    def start(
        cls,
        prompt_ids: list[int],
        sampling: SamplingParams,
        spec: SpecConfig,
        proposer: Optional[Proposer],
        verify: Verifier,
        device: torch.device,
        max_context: int,
        processors: tuple[TargetProcessor, ...] = (),
    ) -> Run:
        """A new answer to prompt_ids: seeded generator, token budget capped by the context left, empty statistics."""
        sampling.validate()
        spec.validate()
        if not prompt_ids:
            raise ConfigError("the prompt is empty")
        if len(prompt_ids) >= max_context:
            raise ConfigError(f"the prompt has {len(prompt_ids)} tokens; this model's context holds {max_context}")
        max_k = spec.k if proposer is not None else 0
        return cls(
            sampling=sampling,
            spec=spec,
            proposer=proposer,
            verify=verify,
            generator=torch.Generator(device=device).manual_seed(sampling.seed),
            max_new=min(sampling.max_new_tokens, max_context - len(prompt_ids)),
            max_k=max_k,
            context=list(prompt_ids),
            stats=StatsSnapshot.start(max_k),
            processors=penalties_for(sampling, prompt_ids) + tuple(processors),
            pending=prompt_ids[-1],
        )

    @property
    def room(self) -> int:
        """Draft tokens this step may make: a step emits at most one more token than it drafts."""
        return self.max_new - self.produced - 1

    @property
    def wants_hidden(self) -> bool:
        return self.proposer is not None and self.proposer.wants_hidden

    @property
    def feature_layers(self) -> tuple[int, ...]:
        """The earlier target layers a head reads besides the last (multi-layer features), from the same forwards."""
        return tuple(self.proposer.feature_layers) if self.wants_hidden else ()

    def prefilled(self, seconds: float) -> None:
        self.stats = replace(self.stats, prefill_s=seconds)

    def record(self, outcome: StepOutcome, reading: Optional[Reading], counted: bool = True) -> None:
        """Fold one step into the statistics: what the controllers now say (reading) and, when the step counted
        (its forward gave finite logits), its counts and times. A dropped draft counts either way."""
        stats = self.stats
        if outcome.dropped:
            stats = replace(stats, dropped_drafts=stats.dropped_drafts + 1)
        if reading is not None:
            stats = replace(stats, k=reading.k, paused=reading.paused, plain_step_s=reading.plain_step_s)
            if reading.predicted_speedup is not None:
                stats = replace(stats, predicted_speedup=reading.predicted_speedup)
        if counted:
            forecast = reading.predicted_speedup if reading is not None and outcome.drafted else None
            stats = replace(
                stats, forecast_plain_steps=stats.forecast_plain_steps + outcome.emitted / (forecast or 1.0)
            )
            stats = stats.after_step(
                outcome.drafted,
                outcome.num_accepted,
                outcome.emitted,
                outcome.propose_s,
                outcome.score_s,
                outcome.sampler_s,
                outcome.depth,
            )
        if stats.first_token_s is None and outcome.emitted:
            stats = replace(stats, first_token_s=time.perf_counter() - self.started)
        self.stats = stats

    def snapshot(self) -> StatsSnapshot:
        return replace(self.stats, elapsed_s=time.perf_counter() - self.started)
