"""What the engine yields. The UI, the CLI and the store only render or record these."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional

TokenKind = Literal["accepted", "resampled", "bonus", "target"]
TOKEN_KINDS: tuple[str, ...] = ("accepted", "resampled", "bonus", "target")


@dataclass(frozen=True)
class TokenEvent:
    """One emitted token and how it was made."""

    token_id: int
    kind: str  # one of TOKEN_KINDS
    target_prob: float  # p_target(token) at its position
    draft_prob: Optional[float] = None  # p_draft(token) for accepted draft tokens (1.0 for n-gram drafts)
    rejected_token_id: Optional[int] = None  # for 'resampled': the draft token the target rejected
    rejected_target_prob: Optional[float] = None
    rejected_draft_prob: Optional[float] = None
    text: str = ""  # filled by the chat layer; the engine knows only ids

    @property
    def acceptance_prob(self) -> Optional[float]:
        """min(1, p_target / p_draft) of the draft token this event judged (the rejected one for 'resampled')."""
        if self.kind == "accepted" and self.draft_prob:
            return min(1.0, self.target_prob / self.draft_prob)
        if self.kind == "resampled" and self.rejected_draft_prob:
            return min(1.0, (self.rejected_target_prob or 0.0) / self.rejected_draft_prob)
        return None

    def to_dict(self) -> dict:
        return {
            "id": self.token_id,
            "text": self.text,
            "kind": self.kind,
            "p_target": self.target_prob,
            "p_draft": self.draft_prob,
            "rejected_id": self.rejected_token_id,
            "rejected_p_target": self.rejected_target_prob,
            "rejected_p_draft": self.rejected_draft_prob,
        }


@dataclass(frozen=True)
class StatsSnapshot:
    """Running statistics of one answer, as of the latest step."""

    drafted: int = 0
    accepted: int = 0
    emitted: int = 0
    target_forwards: int = 0
    elapsed_s: float = 0.0
    prefill_s: float = 0.0
    propose_s: float = 0.0
    score_s: float = 0.0
    sampler_s: float = 0.0
    per_position_drafted: tuple[int, ...] = ()
    per_position_accepted: tuple[int, ...] = ()
    k: int = 0  # K of the latest step (the adaptive controller may change it)
    predicted_speedup: Optional[float] = None  # E / (K·c + v) from measured costs, when known
    dropped_drafts: int = 0  # steps whose draft had NaN / infinite probabilities (run as plain steps)

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
    def per_position_acceptance(self) -> tuple[float, ...]:
        return tuple(a / d if d else 0.0 for a, d in zip(self.per_position_accepted, self.per_position_drafted))

    def to_dict(self) -> dict:
        return {
            "drafted": self.drafted,
            "accepted": self.accepted,
            "emitted": self.emitted,
            "acceptance_rate": self.acceptance_rate,
            "mean_acceptance_length": self.mean_acceptance_length,
            "tokens_per_s": self.tokens_per_s,
            "target_forwards": self.target_forwards,
            "elapsed_s": self.elapsed_s,
            "prefill_s": self.prefill_s,
            "propose_s": self.propose_s,
            "score_s": self.score_s,
            "sampler_s": self.sampler_s,
            "per_position_acceptance": list(self.per_position_acceptance),
            "per_position_drafted": list(self.per_position_drafted),
            "k": self.k,
            "predicted_speedup": self.predicted_speedup,
        }


@dataclass(frozen=True)
class StepEvent:
    """One engine step: propose K → one target forward over K+1 positions → rejection sampling."""

    tokens: tuple[TokenEvent, ...]
    propose_time_us: float
    score_time_us: float
    sampler_time_us: float
    propose_token_num: int  # draft tokens proposed this step (K, or fewer when the n-gram found fewer)
    accept_token_num: int  # draft tokens accepted this step
    stats: StatsSnapshot = field(default_factory=StatsSnapshot)
    finished: bool = False
    finish_reason: Optional[str] = None  # 'stop' | 'length' | 'cancelled' | 'error'
    error: Optional[str] = None
