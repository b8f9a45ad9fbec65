"""Running statistics of one answer: acceptance, per-position acceptance, time split.

StatsSnapshot is the one record. The engine folds each step into it (after_step); every other form is derived:
the JSON form (to_dict: the fields plus the derived rates), the bench's sums, the UI's table.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Literal, Optional


@dataclass(frozen=True)
class PauseReason:
    """Why adaptive speculation is off, in the deciding controller's numbers (the chain's or the tree-size one's)."""

    shape: Literal["chain", "tree"]  # the best drafting option's shape
    k: int  # what it drafts: K tokens, or N tree nodes
    cost: float  # a step of it, in plain steps (K·c + v(K) for a chain)
    tokens: float  # tokens such a step would emit (E(K) for a chain)
    speedup: float  # tokens / cost
    probe_every: int  # steps between probes that draft it to look again


@dataclass(frozen=True)
class StatsSnapshot:
    """Statistics of one answer as of its latest step. Mean acceptance length counts the bonus / resampled token."""

    drafted: int = 0  # draft positions: a chain's every token, a token tree's depth (one path's worth)
    accepted: int = 0  # of those, kept (a tree: the accepted path's depth)
    emitted: int = 0
    target_forwards: int = 0
    elapsed_s: float = 0.0
    prefill_s: float = 0.0
    propose_s: float = 0.0
    score_s: float = 0.0
    sampler_s: float = 0.0
    per_position_drafted: tuple[int, ...] = ()
    per_position_accepted: tuple[int, ...] = ()
    k: int = 0  # K of the latest step (the adaptive controller may change it); a token tree's depth
    tree_nodes_drafted: int = 0  # every node of the token trees drafted, siblings included (0 for chains)
    predicted_speedup: Optional[float] = None  # E / (K·c + v) from measured costs, when known
    paused: Optional[PauseReason] = None  # adaptive speculation is off, and why
    dropped_drafts: int = 0  # steps whose draft had NaN / infinite probabilities (run as plain steps)
    # seconds from the request to the first emitted token: the prompt's prefill and the first step (None before it)
    first_token_s: Optional[float] = None
    # the controllers' running estimate of a plain step (score + sample of a 1-token forward) measured on this
    # machine, as of this step; None without a proposer or before a plain step was measured
    plain_step_s: Optional[float] = None
    # the answer's steps as the controllers forecast them, in plain steps: Σ emitted / the step's forecast speedup
    # (1 for a step that drafted nothing), for answer_forecast
    forecast_plain_steps: float = 0.0

    @classmethod
    def from_dict(cls, data: dict) -> StatsSnapshot:
        """The stored JSON form (to_dict) back as the record; the derived rates and unknown keys are left out."""
        names = {f.name for f in fields(cls)}
        values = {key: value for key, value in data.items() if key in names}
        for key in ("per_position_drafted", "per_position_accepted"):
            if key in values:
                values[key] = tuple(values[key])
        paused = values.get("paused")
        if isinstance(paused, dict):
            values["paused"] = PauseReason(
                paused.get("shape", "chain"),
                paused.get("k", 0),
                paused.get("cost", 0.0),
                paused.get("tokens", 0.0),
                paused.get("speedup", 0.0),
                paused.get("probe_every", 0),
            )
        return cls(**values)

    @classmethod
    def start(cls, max_k: int) -> StatsSnapshot:
        return cls(per_position_drafted=(0,) * max_k, per_position_accepted=(0,) * max_k, k=max_k)

    def after_step(
        self,
        drafted: int,
        accepted: int,
        emitted: int,
        propose_s: float,
        score_s: float,
        sampler_s: float,
        depth: Optional[int] = None,
    ) -> StatsSnapshot:
        """These statistics with one more step: `drafted` tokens proposed, `accepted` kept, `emitted` emitted.
        depth: for a token tree of `drafted` nodes, its depth. A tree is counted per path: it drafts `depth`
        positions (drafted, per-position counts and K are per depth) and its nodes count in tree_nodes_drafted;
        None for a chain (depth = drafted)."""
        positions = drafted if depth is None else depth
        width = max(len(self.per_position_drafted), positions)
        pos_drafted = list(self.per_position_drafted) + [0] * (width - len(self.per_position_drafted))
        pos_accepted = list(self.per_position_accepted) + [0] * (width - len(self.per_position_accepted))
        for position in range(positions):
            pos_drafted[position] += 1
            pos_accepted[position] += position < accepted
        return replace(
            self,
            drafted=self.drafted + positions,
            tree_nodes_drafted=self.tree_nodes_drafted + (0 if depth is None else drafted),
            k=self.k if depth is None else depth,
            accepted=self.accepted + accepted,
            emitted=self.emitted + emitted,
            target_forwards=self.target_forwards + 1,
            propose_s=self.propose_s + propose_s,
            score_s=self.score_s + score_s,
            sampler_s=self.sampler_s + sampler_s,
            per_position_drafted=tuple(pos_drafted),
            per_position_accepted=tuple(pos_accepted),
        )

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens per target forward; the bonus / resampled token counts."""
        return self.emitted / self.target_forwards if self.target_forwards else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.emitted / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def other_s(self) -> float:
        """Seconds of the answer outside prefill and its steps' propose / score / sample: waiting for the engine, the
        loop's bookkeeping, and the time the consumer (the window, the API) held the stream between two steps. The parts
        add up to elapsed_s, so tokens/s = emitted / (prefill + steps + other)."""
        return max(self.elapsed_s - self.prefill_s - self.propose_s - self.score_s - self.sampler_s, 0.0)

    @property
    def step_tokens_per_s(self) -> float:
        """Tokens per second of the steps alone (propose + score + sample): the rate comparable to plain_tokens_per_s,
        which counts the same parts of a plain step."""
        steps = self.propose_s + self.score_s + self.sampler_s
        return self.emitted / steps if steps > 0 else 0.0

    @property
    def plain_tokens_per_s(self) -> Optional[float]:
        """Plain decoding's tokens per second of steps on this machine, from the running estimate of a plain step."""
        return 1.0 / self.plain_step_s if self.plain_step_s else None

    @property
    def answer_forecast(self) -> Optional[float]:
        """The controllers' forecast of this answer's speedup over plain decoding of the same prompt: each step's
        forecast (predicted_speedup after it, 1 where it drafted nothing) weighted by the tokens it emitted, with the
        prompt's prefill, which both read alike, on both sides. None before a plain step's cost is known."""
        if not self.plain_step_s or self.forecast_plain_steps <= 0:
            return None
        plain = self.plain_step_s
        return (self.prefill_s + self.emitted * plain) / (self.prefill_s + self.forecast_plain_steps * plain)

    @property
    def per_position_acceptance(self) -> tuple[float, ...]:
        return tuple(a / d if d else 0.0 for a, d in zip(self.per_position_accepted, self.per_position_drafted))

    def to_dict(self) -> dict:
        """The JSON form: every field, plus the derived rates."""
        data = asdict(self)
        data.update(
            per_position_drafted=list(self.per_position_drafted),
            per_position_accepted=list(self.per_position_accepted),
            per_position_acceptance=list(self.per_position_acceptance),
            acceptance_rate=self.acceptance_rate,
            mean_acceptance_length=self.mean_acceptance_length,
            tokens_per_s=self.tokens_per_s,
            other_s=self.other_s,
            step_tokens_per_s=self.step_tokens_per_s,
            plain_tokens_per_s=self.plain_tokens_per_s,
            answer_forecast=self.answer_forecast,
        )
        return data
