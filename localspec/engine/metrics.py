"""Running statistics of one answer: acceptance, per-position acceptance, time split."""
from __future__ import annotations

import time

from .events import StatsSnapshot


class SpecStats:
    """Accumulates step metrics. Mean acceptance length counts the bonus / resampled token."""

    def __init__(self, max_k: int) -> None:
        self.started = time.perf_counter()
        self.drafted = 0
        self.accepted = 0
        self.emitted = 0
        self.target_forwards = 0
        self.prefill_s = 0.0
        self.propose_s = 0.0
        self.score_s = 0.0
        self.sampler_s = 0.0
        self.per_position_drafted = [0] * max_k
        self.per_position_accepted = [0] * max_k
        self.k = max_k
        self.predicted_speedup: float | None = None
        self.dropped_drafts = 0  # steps whose draft had non-finite probabilities: run as plain steps

    def record_step(self, drafted: int, accepted: int, emitted: int, propose_s: float, score_s: float,
                    sampler_s: float) -> None:
        self.drafted += drafted
        self.accepted += accepted
        self.emitted += emitted
        self.target_forwards += 1
        self.propose_s += propose_s
        self.score_s += score_s
        self.sampler_s += sampler_s
        if drafted > len(self.per_position_drafted):
            grow = drafted - len(self.per_position_drafted)
            self.per_position_drafted += [0] * grow
            self.per_position_accepted += [0] * grow
        for position in range(drafted):
            self.per_position_drafted[position] += 1
            if position < accepted:
                self.per_position_accepted[position] += 1

    def snapshot(self) -> StatsSnapshot:
        return StatsSnapshot(
            drafted=self.drafted,
            accepted=self.accepted,
            emitted=self.emitted,
            target_forwards=self.target_forwards,
            elapsed_s=time.perf_counter() - self.started,
            prefill_s=self.prefill_s,
            propose_s=self.propose_s,
            score_s=self.score_s,
            sampler_s=self.sampler_s,
            per_position_drafted=tuple(self.per_position_drafted),
            per_position_accepted=tuple(self.per_position_accepted),
            k=self.k,
            predicted_speedup=self.predicted_speedup,
            dropped_drafts=self.dropped_drafts,
        )
