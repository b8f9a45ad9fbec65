"""Adaptive speculation: pick K each step from measured costs and acceptance, and switch speculation off when no K
is predicted to beat plain decoding.

Model (DESIGN.md words). For a step that drafts K tokens:
  cost(K)    = K·c + v(K)          in units of one plain step (a 1-token target forward + sampling)
  tokens(K)  = E(K) = 1 + Σ_{i≤K} Π_{j≤i} a_j      (a_j: acceptance at draft position j, given j was reached)
  speedup(K) = E(K) / cost(K)
c = draft time per drafted token / plain step time; v(K) = (K+1)-token verify step / plain step. Both are measured
from the engine's own step timings; the per-position acceptance from the steps' outcomes, with exponential
forgetting so the controller follows the text (chat vs code) within an answer.

The controller is pure Python (no torch) so its decisions are unit-tested with synthetic numbers.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from localspec.runtime.speedup import PRIOR_ACCEPTANCE, expected_tokens, predicted_speedups

from .metrics import PauseReason

# Verify cost shape v(K) ≈ 1 + slope·K that the measured line is pulled towards, when nothing better is known: the
# engine replaces it with the slope timed on this machine at load (VerifyCosts.set_prior, from dtype_choice).
PRIOR_VERIFY_SLOPE = 0.12


class _RecentMedian:
    """Median of the last `window` samples: on a shared machine a step that was preempted takes 10× longer, and a
    median ignores it where a mean would not."""

    def __init__(self, window: int = 15) -> None:
        self.samples: deque[float] = deque(maxlen=window)
        self.count = 0
        self.value = 0.0

    def add(self, sample: float) -> None:
        self.samples.append(sample)
        self.count += 1
        self.value = statistics.median(self.samples)


class RunningTime:
    """Seconds of one kind of step (a plain step, a verify of n rows, a proposal), as a running estimate that follows
    the machine within a few steps: each sample is the median of the last three (one preempted step moves nothing),
    folded into a mean that remembers at most `memory` samples, so two steps at a new cost move it most of the way.
    `weight` is the aged count of samples (age() is called at every verify of any size): a stale estimate (weight
    below 1) is replaced by the next sample, which says what the machine does now."""

    def __init__(self, memory: float = 3.0) -> None:
        self.memory = memory
        self.recent: deque[float] = deque(maxlen=3)
        self.weight = 0.0
        self.count = 0
        self.value = 0.0

    @classmethod
    def prior(cls, seconds: float, memory: float = 3.0) -> RunningTime:
        """An estimate of `seconds` from outside the answers (a load-time timing): read as a measurement until the
        first sample, which replaces it (its weight is 0)."""
        estimate = cls(memory)
        estimate.value, estimate.count = seconds, 1
        return estimate

    def age(self, factor: float) -> None:
        self.weight *= factor

    def add(self, sample: float) -> None:
        if self.weight < 1.0:
            self.recent.clear()
        self.recent.append(sample)
        kept = min(self.weight, self.memory) if self.weight >= 1.0 else 0.0
        self.value = (kept * self.value + statistics.median(self.recent)) / (kept + 1.0)
        self.weight += 1.0
        self.count += 1


# How the verify line weighs what it measured (VerifyCosts.line). A size's weight is its count of samples, aged by
# Tuning.verify_age at every verify of any size: the sizes the controller stopped picking were measured at another
# context length, and often in a slow stretch, and must not pin the line for the rest of the session. The slope is
# pulled towards the prior with the weight of that many samples one row from the mean: a timing of this machine's
# forwards at load (set_prior) is worth Tuning.verify_prior_weight, so a few noisy medians at nearby sizes cannot
# tilt the line; the constant guess only Tuning.guess_prior_weight. A negative fit is kept, not replaced by the
# prior: replacing only those would bias the slope upwards on a machine where rows are nearly free.


@dataclass(frozen=True)
class Tuning:
    """How a controller (chain or tree size) learns and switches speculation off and on."""

    prior_weight: float = 2.0  # steps a prior acceptance is worth
    forget: float = 0.95  # per-step decay of the acceptance counts: the estimate follows the text within an answer
    # per drafting step of another shape, the decay of a tree size's counts: a size shut out by a bad stretch drifts
    # back to its optimistic prior and is tried again (slower than `forget`: each retry that finds nothing costs)
    age: float = 0.98
    off_below: float = 1.0  # switch off when the best predicted speedup drops below this
    on_above: float = 1.03  # back on when it rises above this
    probe_budget: float = 0.02  # share of the time probes may cost while off
    min_probe_every: int = 4  # steps between probes, at least
    max_probe_every: int = 64  # … and at most
    # the verify line (VerifyCosts): each size's sample count ages by verify_age at every verify; the prior slope
    # weighs as many samples as verify_prior_weight (timed at load) or guess_prior_weight (the constant guess)
    verify_age: float = 0.97
    verify_prior_weight: float = 8.0
    guess_prior_weight: float = 1.0
    # the running estimates (RunningTime): each remembers at most this many samples
    memory: float = 3.0
    # while speculating, a plain step now and then measures what every forecast is relative to: when the plain
    # estimate's aged count falls below plain_below (about every 75 steps), or when a drafting size's estimate has
    # moved by more than plain_drift× since the last plain step (a verify now costs something else)
    plain_below: float = 0.1
    plain_drift: float = 1.5

    def probe_every(self, loss: float) -> int:
        """Steps between probes that each cost `loss` plain steps more than a plain step, within the budget."""
        return int(min(max(math.ceil(loss / self.probe_budget), self.min_probe_every), self.max_probe_every))


@dataclass
class VerifyCosts:
    """The target's verify seconds by rows scored: a property of the target on this machine, so one record is
    shared by every controller of an engine (each proposer part adds its steps' samples)."""

    by_rows: dict[int, RunningTime] = field(default_factory=dict)  # rows (K + 1) → seconds of score + sample
    prior_slope: float = PRIOR_VERIFY_SLOPE  # v(K) ≈ 1 + prior_slope·K, the shape the line is pulled towards
    prior_timed: bool = False  # prior_slope was timed on this machine (set_prior), not the constant guess
    tuning: Tuning = Tuning()
    # each drafting size's estimate as of the last plain step (or as first measured after it), and whether one has
    # since moved by more than tuning.plain_drift×: the plain step is then measured again (plain_due)
    anchor: dict[int, float] = field(default_factory=dict)
    drifted: bool = False
    # line()'s result until a sample or the prior changes it: the controllers ask for it dozens of times a step
    _line: tuple[float, float] | None = field(default=None, init=False, repr=False, compare=False)
    # counts those changes, so that what is derived from this record (CostModel's ratios) is kept until the next one
    generation: int = field(default=0, init=False, repr=False, compare=False)

    @property
    def prior_weight(self) -> float:
        """The prior slope's weight: samples one row from the mean it is worth."""
        return self.tuning.verify_prior_weight if self.prior_timed else self.tuning.guess_prior_weight

    def set_prior(self, plain_s: float, verify_s: float, rows: int) -> None:
        """The shape to assume, from a 1-token and a `rows`-token forward timed on this machine (the dtype
        decision's timings)."""
        self.prior_slope = max(verify_s / plain_s - 1.0, 0.0) / max(rows - 1, 1)
        self.prior_timed = True
        self._line = None
        self.generation += 1

    def add(self, rows: int, seconds: float) -> None:
        """One verify of `rows` rows took `seconds`; every size's weight ages by tuning.verify_age."""
        for estimate in self.by_rows.values():
            estimate.age(self.tuning.verify_age)
        estimate = self.by_rows.setdefault(rows, RunningTime(self.tuning.memory))
        estimate.add(seconds)
        if rows == 1:
            self.anchor = {n: e.value for n, e in self.by_rows.items() if n > 1}
            self.drifted = False
        elif rows not in self.anchor:
            self.anchor[rows] = estimate.value
        elif not 1 / self.tuning.plain_drift <= estimate.value / self.anchor[rows] <= self.tuning.plain_drift:
            self.drifted = True
        self._line = None
        self.generation += 1

    def plain_due(self) -> bool:
        """Whether a speculating controller should run a plain step now, to measure what its forecasts are relative
        to: none measured yet, the last one aged out, or a drafting size's cost moved since it was measured."""
        plain = self.by_rows.get(1)
        if plain is None:  # the first after as many drafting steps as the interval's weight allows (10 by default)
            return sum(e.count for e in self.by_rows.values()) * self.tuning.plain_below >= 1.0
        return plain.weight < self.tuning.plain_below or self.drifted

    def plain_s(self) -> float | None:
        """The running estimate of a plain step's seconds (score + sample of a 1-token forward), as measured on this
        machine; None before a plain step was measured."""
        plain = self.by_rows.get(1)
        return plain.value if plain is not None and plain.count else None

    def line(self) -> tuple[float, float] | None:
        """t(n) = intercept + slope·n through the measured sizes' medians, weighted by their aged counts, with the
        slope pulled towards the prior's (ridge regression; with one size, the prior shape through it). None before
        any measurement."""
        if self._line is None:
            self._line = self._fit()
        return self._line

    def _fit(self) -> tuple[float, float] | None:
        points = [(n, e.value, e.weight) for n, e in self.by_rows.items() if e.count > 0]
        total = sum(w for _, _, w in points)
        if not points or total <= 0:
            return None
        mean_n = sum(n * w for n, _, w in points) / total
        mean_t = sum(t * w for _, t, w in points) / total
        sxx = sum(w * (n - mean_n) ** 2 for n, _, w in points)
        sxy = sum(w * (n - mean_n) * (t - mean_t) for n, t, w in points)
        prior = self.prior_slope * mean_t / (1 + self.prior_slope * (mean_n - 1))  # seconds per row, at this level
        slope = max((sxy + self.prior_weight * prior) / (sxx + self.prior_weight), 0.0)
        intercept = mean_t - slope * mean_n
        if intercept + slope <= 0:  # a plain step cannot be free: the prior shape through the weighted mean
            slope = prior
            intercept = mean_t - slope * mean_n
        return intercept, slope


@dataclass
class CostModel:
    """Step costs of one (target, proposer) pair on this machine. Kept by the engine across answers."""

    verify: VerifyCosts = field(default_factory=VerifyCosts)
    # proposer seconds per drafted token asked for
    propose_per_token_s: RunningTime = field(default_factory=RunningTime)
    # plain_time, verify_ratio and ratios as of (the verify record, its generation, the proposal samples): the
    # controllers ask for them dozens of times a step, and they change only with a sample (or the prior)
    _memo: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    _memo_of: tuple = field(default=(), init=False, repr=False, compare=False)

    def state(self) -> tuple:
        """What every figure derived from this model depends on: equal states, equal figures."""
        return (id(self.verify), self.verify.generation, self.propose_per_token_s.count)

    def _remembered(self, key: tuple, compute: Callable[[], Any]) -> Any:
        state = self.state()
        if state != self._memo_of:
            self._memo.clear()
            self._memo_of = state
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    def observe(self, asked: int, drafted: int, propose_s: float, verify_s: float) -> None:
        self.observe_verify(drafted + 1, verify_s)
        if asked > 0:
            self.propose_per_token_s.add(propose_s / asked)

    def observe_verify(self, rows: int, verify_s: float) -> None:
        """Seconds of score + sample for a forward of `rows` rows (a chain's K + 1, or a tree's N + 1)."""
        self.verify.add(rows, verify_s)

    def verify_time(self, tokens: int, line: tuple[float, float] | None = None) -> float | None:
        """Seconds to verify `tokens` positions, from the line through every measured size (VerifyCosts.line);
        None before any measurement. The line, not each size's own median: a size is measured when the text made
        the controller pick it, at whatever context length the answer had reached, and the attention over a longer
        cache costs more, so single sizes' medians mix in the context length."""
        line = line or self.verify.line()
        return None if line is None else line[0] + line[1] * tokens

    def plain_time(self, line: tuple[float, float] | None = None) -> float | None:
        """Seconds of a plain step, what every ratio is relative to: the line's t(1) (it reads every size, so a
        plain step measured early in an answer, on a short cache, does not stand alone), held within
        tuning.plain_drift× of the plain steps' own running estimate while that is fresh. Unheld, the line can
        mislead: its slope is pulled towards the prior, so when verifies turn dear its t(1) rises far above what a
        plain step measures and every verify looks cheap against it (VerifyCosts.plain_due measures the plain step
        again when a verify size drifts by that factor)."""
        if line is None:
            return self._remembered(("plain",), lambda: self._plain_time(None))
        return self._plain_time(line)

    def _plain_time(self, line: tuple[float, float] | None) -> float | None:
        at_one = self.verify_time(1, line)
        plain = self.verify.by_rows.get(1)
        if at_one is None or plain is None or not plain.count or plain.weight < self.verify.tuning.plain_below:
            return at_one
        drift = self.verify.tuning.plain_drift
        return min(max(at_one, plain.value / drift), plain.value * drift)

    def verify_ratio(self, rows: int, line: tuple[float, float] | None = None) -> float | None:
        """v: seconds to verify `rows` positions relative to a plain step, at least the plain step plus the line's
        cost per extra row; None before any measurement."""
        if line is None:
            return self._remembered(("verify", rows), lambda: self._verify_ratio(rows, self.verify.line()))
        return self._verify_ratio(rows, line)

    def _verify_ratio(self, rows: int, line: tuple[float, float] | None) -> float | None:
        plain = self.plain_time(line)
        if line is None or plain is None or plain <= 0:
            return None
        seconds = max(line[0] + line[1] * rows, plain + line[1] * (rows - 1), plain)
        return seconds / plain

    def ratios(self, max_k: int) -> tuple[float, list[float]]:
        """(c, [v(0)=1, v(1), …, v(max_k)]) relative to a plain step; the prior when nothing is measured yet. The
        list is shared until the costs change: read it, never change it."""
        return self._remembered(("ratios", max_k), lambda: self._ratios(max_k))

    def _ratios(self, max_k: int) -> tuple[float, list[float]]:
        line = self.verify.line()
        plain = self.plain_time(line)
        if plain is None or plain <= 0:
            return 0.0, [1 + self.verify.prior_slope * k for k in range(max_k + 1)]
        verify = [1.0] + [self.verify_ratio(k + 1, line) or 1.0 for k in range(1, max_k + 1)]
        draft_c = self.propose_per_token_s.value / plain if self.propose_per_token_s.count else 0.0
        return draft_c, verify


class OnOffSwitch:
    """Speculation on or off with hysteresis, probes while off and plain steps now and then while on; shared by the
    chain and tree-size controllers, so this is the one place a step is decided plain or drafting.

    on: switch off when the best predicted speedup drops below tuning.off_below; a plain step when the verify costs
    ask for one (VerifyCosts.plain_due: every forecast is relative to a plain step, so it is measured as the machine
    goes, not only at load). off: plain steps until `probe_every()` of them have passed, then one probe step; back on
    when it rises above tuning.on_above. The options are evaluated while off only when a probe may be due (rest):
    a plain step changes nothing a forecast reads but the plain step's own cost, so the plain steps between probes
    cost what plain decoding's do.
    """

    tuning: Tuning
    costs: CostModel
    speculating: bool
    steps_off: int
    probing: bool
    measuring_plain: bool  # this step is a plain step taken while speculating
    rested: bool = False  # this step was decided plain by rest(), no option evaluated
    due_every: int = 0  # steps between probes, as of the last evaluation while off (0: none since switching off)
    paused: PauseReason | None = None  # pause_reason() as of the last evaluation while off

    def rest(self) -> bool:
        """Whether this step is plain without evaluating anything: off, and the next probe not due yet."""
        self.rested = not self.speculating and self.steps_off + 1 < self.due_every
        if self.rested:
            self.probing = self.measuring_plain = False
            self.steps_off += 1
        return self.rested

    def pause_reason(self) -> PauseReason | None:
        """Why speculation is off, in the controller's own numbers (PauseReason); None while it speculates. After a
        step rest() decided, the reason as of the last evaluation."""
        if self.speculating:
            return None
        if not self.rested or self.paused is None:
            self.paused = self._pause_now()
        return self.paused

    def _pause_now(self) -> PauseReason:
        raise NotImplementedError

    def switch(self, speedup: float, probe_every: Callable[[], int]) -> bool:
        """Given the best option's predicted speedup: does this step draft (speculating, or probing)?"""
        self.probing = self.measuring_plain = False
        if self.speculating and speedup < self.tuning.off_below:
            self.speculating = False
            self.steps_off = 0
        elif not self.speculating and speedup > self.tuning.on_above:
            self.speculating = True
        if not self.speculating:
            self.steps_off += 1
            self.due_every = probe_every()
            if self.steps_off < self.due_every:
                return False
            self.probing = True
        elif self.costs.verify.plain_due():
            self.measuring_plain = True
            return False
        return True


class AdaptiveController(OnOffSwitch):
    """Asked by the engine for K before each step (0 = speculation off this step); told the step's outcome after.

    on:  K = argmax speedup(K); switch off when the best predicted speedup drops below `off_below`.
    off: plain steps, and now and then one probe step that drafts the predicted-best K ≥ 1, so a change in the
         text (code after chat) is noticed. A probe that finds nothing costs K·c + v(K) − 1 plain steps, so probes
         are spaced to spend at most `probe_budget` of the time (a free n-gram probe every few steps, a costly draft
         model rarely), between `min_probe_every` and `max_probe_every` steps. A probe whose proposer drafted
         nothing (no n-gram match) taught nothing and cost nothing: the next step probes again.
    """

    def __init__(
        self,
        max_k: int,
        costs: CostModel | None = None,
        prior_acceptance: float = PRIOR_ACCEPTANCE,
        tuning: Tuning = Tuning(),
    ) -> None:
        if max_k < 1:
            raise ValueError("max_k must be ≥ 1")
        self.max_k = max_k
        self.costs = costs if costs is not None else CostModel()
        self.prior_acceptance = prior_acceptance
        self.tuning = tuning
        self.reached = [0.0] * max_k  # decayed counts: steps that drafted position i with all before it accepted
        self.accepted = [0.0] * max_k  # … of which position i was accepted
        self.position_prior: list[float] | None = None  # the previous answer's acceptance, once there was one
        self.speculating = True
        # acceptance() and speedups() as of the state they were computed from (asked several times a step)
        self._acceptance: tuple[tuple, list[float]] | None = None
        self._speedups: tuple[tuple, list[float]] | None = None
        self.begin()

    def begin(self) -> None:
        """A new answer: keep the costs (machine properties); the last answer's acceptance becomes this answer's
        prior (worth `prior_weight` steps, so new text takes over within a few steps)."""
        if any(self.reached):
            self.position_prior = self.acceptance()
        self.reached = [0.0] * self.max_k
        self.accepted = [0.0] * self.max_k
        self.steps_off = 0
        self.probing = self.measuring_plain = self.rested = False
        self.due_every = 0  # the answer's first step evaluates its options
        self.last_k = 0
        self.last_predicted = 1.0

    # -- estimates -------------------------------------------------------------------------------------------------
    def evidence(self) -> tuple:
        """What acceptance() depends on: equal evidence, equal rates."""
        prior = None if self.position_prior is None else tuple(self.position_prior)
        return (tuple(self.reached), tuple(self.accepted), prior, self.prior_acceptance, self.tuning.prior_weight)

    def acceptance(self) -> list[float]:
        """Per-position conditional acceptance, each shrunk towards its prior: the previous answer's estimate for
        that position when there was one, else the estimate of the position before it. The list is shared until the
        evidence changes: read it, never change it."""
        evidence = self.evidence()
        if self._acceptance is None or self._acceptance[0] != evidence:
            self._acceptance = (evidence, self._rates())
        return self._acceptance[1]

    def _rates(self) -> list[float]:
        rates, prior = [], self.prior_acceptance
        for position, (reached, accepted) in enumerate(zip(self.reached, self.accepted)):
            if self.position_prior is not None:
                prior = self.position_prior[position]
            rate = (accepted + self.tuning.prior_weight * prior) / (reached + self.tuning.prior_weight)
            rates.append(rate)
            prior = rate
        return rates

    def speedups(self) -> list[float]:
        """Predicted speedup of each K (index 0: a plain step); shared until the evidence or the costs change."""
        state = (self.evidence(), self.costs.state())
        if self._speedups is None or self._speedups[0] != state:
            draft_c, verify = self.costs.ratios(self.max_k)
            self._speedups = (state, predicted_speedups(self.acceptance(), draft_c, verify))
        return self._speedups[1]

    def predicted(self, k: int) -> float:
        """Predicted speedup of drafting k tokens per step (1.0 for a plain step), from what is measured so far."""
        return self.speedups()[min(k, self.max_k)] if k > 0 else 1.0

    def best(self) -> tuple[int, float]:
        """(K ≥ 1 with the highest predicted speedup, that speedup)."""
        speedups = self.speedups()
        k = max(range(1, self.max_k + 1), key=lambda i: (speedups[i], -i))
        return k, speedups[k]

    def probe_every(self, k: int) -> int:
        """Steps between probes so that probes drafting k tokens cost at most probe_budget of the time."""
        draft_c, verify = self.costs.ratios(self.max_k)
        loss = max(k * draft_c + verify[k] - 1.0, 0.0)
        return self.tuning.probe_every(loss)

    def _pause_now(self) -> PauseReason:
        """Why speculation is off (k: the best draft length)."""
        k, speedup = self.best()
        draft_c, verify = self.costs.ratios(self.max_k)
        cost = k * draft_c + verify[k]
        return PauseReason("chain", k, cost, expected_tokens(self.acceptance(), k), speedup, self.probe_every(k))

    # -- the two calls the engine makes ----------------------------------------------------------------------------
    def choose_k(self) -> int:
        if self.rest():
            self.last_k, self.last_predicted = 0, 1.0
            return 0
        k, speedup = self.best()
        if not self.switch(speedup, lambda: self.probe_every(k)):
            self.last_k, self.last_predicted = 0, 1.0
            return 0
        self.last_k, self.last_predicted = k, speedup
        return k

    def observe(self, asked: int, drafted: int, num_accepted: int, propose_s: float, verify_s: float) -> None:
        """One step's outcome: K asked for, drafts the proposer returned, how many the target kept, and the
        seconds spent proposing and verifying (target forward + sampling)."""
        self.costs.observe(asked, drafted, propose_s, verify_s)
        if drafted == 0:
            return  # nothing to learn (an unanswered probe stays due)
        self.steps_off = 0
        self.observe_acceptance(drafted, num_accepted)
        if self.probing:
            _, speedup = self.best()
            if speedup > self.tuning.on_above:  # the probe found text worth speculating on
                self.speculating = True

    def observe_acceptance(self, drafted: int, num_accepted: int) -> None:
        """A chain of `drafted` tokens of which the target kept the first num_accepted: the per-position counts
        (from a chain step, or from a greedy tree step's first branch, which is the chain the tree grew from)."""
        self.reached = [r * self.tuning.forget for r in self.reached]
        self.accepted = [a * self.tuning.forget for a in self.accepted]
        for position in range(min(num_accepted + 1, drafted, self.max_k)):
            self.reached[position] += 1.0
            if position < num_accepted:
                self.accepted[position] += 1.0
