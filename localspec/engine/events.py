"""What the engine yields. The UI, the CLI and the store only render or record these."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Literal, Optional, Union, get_args

from .metrics import StatsSnapshot
from .plan import PLAIN, StepPlan

TokenKind = Literal["accepted", "resampled", "bonus", "target"]
TOKEN_KINDS: tuple[TokenKind, ...] = get_args(TokenKind)
FinishReason = Literal["stop", "length", "cancelled", "error"]

__all__ = [
    "TokenKind",
    "TOKEN_KINDS",
    "FinishReason",
    "TokenEvent",
    "StatsSnapshot",
    "StepEvent",
    "StepPlan",
    "PrefillProgress",
    "EngineEvent",
    "steps",
]


@dataclass(frozen=True)
class TokenEvent:
    """One emitted token and how it was made."""

    token_id: int
    kind: TokenKind
    target_prob: float  # p_target(token) at its position
    draft_prob: Optional[float] = None  # p_draft(token) for accepted draft tokens (1.0 for n-gram drafts)
    rejected_token_id: Optional[int] = None  # for 'resampled': the draft token the target rejected
    rejected_target_prob: Optional[float] = None
    rejected_draft_prob: Optional[float] = None
    # (token id, log-probability) of the n most likely tokens at this position under the distribution the sampler
    # used, most likely first; None unless SamplingParams.top_logprobs > 0
    top_logprobs: Optional[tuple[tuple[int, float], ...]] = None
    logprob: Optional[float] = None  # its own log-probability, read with top_logprobs (equal to its entry there)
    branch: int = 0  # a token tree's accepted node: its index among its siblings (0 = the proposer's first choice)
    text: str = ""  # filled by the chat layer; the engine knows only ids

    @classmethod
    def accepted(cls, token_id: int, target_prob: float, draft_prob: float) -> TokenEvent:
        """A draft token the target kept."""
        return cls(token_id, "accepted", target_prob, draft_prob)

    @classmethod
    def resampled(
        cls,
        token_id: int,
        target_prob: float,
        rejected_token_id: int,
        rejected_target_prob: float,
        rejected_draft_prob: float,
    ) -> TokenEvent:
        """The target's token in place of the draft token it rejected."""
        return cls(
            token_id,
            "resampled",
            target_prob,
            rejected_token_id=rejected_token_id,
            rejected_target_prob=rejected_target_prob,
            rejected_draft_prob=rejected_draft_prob,
        )

    @property
    def acceptance_prob(self) -> Optional[float]:
        """min(1, p_target / p_draft) of the draft token this event judged (the rejected one for 'resampled')."""
        if self.kind == "accepted" and self.draft_prob:
            return min(1.0, self.target_prob / self.draft_prob)
        if self.kind == "resampled" and self.rejected_draft_prob:
            return min(1.0, (self.rejected_target_prob or 0.0) / self.rejected_draft_prob)
        return None

    def to_dict(self) -> dict:
        """The record the UI, the store and the API keep; "branch" only for a tree node off the first choice."""
        branch = {"branch": self.branch} if self.branch else {}
        return {
            "id": self.token_id,
            "text": self.text,
            "kind": self.kind,
            "p_target": self.target_prob,
            "p_draft": self.draft_prob,
            "rejected_id": self.rejected_token_id,
            "rejected_p_target": self.rejected_target_prob,
            "rejected_p_draft": self.rejected_draft_prob,
            **branch,
        }


@dataclass(frozen=True)
class StepEvent:
    """One engine step: the plan it ran (plain, a chain of K, a tree of N nodes) → one target forward over the
    pending token and the drafts → verification."""

    tokens: tuple[TokenEvent, ...] = ()
    propose_time_us: float = 0.0
    score_time_us: float = 0.0
    sampler_time_us: float = 0.0
    propose_token_num: int = 0  # draft tokens proposed this step (K, or fewer when the n-gram found fewer)
    accept_token_num: int = 0  # draft tokens accepted this step
    stats: StatsSnapshot = field(default_factory=StatsSnapshot)
    finished: bool = False
    finish_reason: Optional[FinishReason] = None
    error: Optional[str] = None
    plan: StepPlan = PLAIN  # what the step ran: the policy's plan (policy.py)

    @classmethod
    def finished_early(
        cls,
        stats: StatsSnapshot,
        reason: FinishReason,
        error: Optional[str] = None,
        drafted: int = 0,
        plan: StepPlan = PLAIN,
    ) -> StepEvent:
        """The answer ends without emitting this step: cancelled, or an error (with its message)."""
        return cls(propose_token_num=drafted, stats=stats, finished=True, finish_reason=reason, error=error, plan=plan)


@dataclass(frozen=True)
class PrefillProgress:
    """The prompt is being read: `read` of its `total` tokens are in the cache, `elapsed_s` seconds after the engine
    took the answer (the clock of StatsSnapshot.first_token_s). Yielded between the prefill's forwards of a prompt
    longer than one of them, the last one with read == total just before the first step; never for a prompt read in
    one forward. It emits nothing and is no step: a consumer that counts steps or tokens skips it (`steps`)."""

    read: int
    total: int
    elapsed_s: float

    @property
    def fraction(self) -> float:
        return self.read / self.total if self.total else 1.0


EngineEvent = Union[StepEvent, PrefillProgress]  # what Engine.generate yields


def steps(events: Iterable[EngineEvent]) -> Iterator[StepEvent]:
    """The step events of an engine stream, for a consumer with no use for the prompt's reading progress."""
    return (event for event in events if isinstance(event, StepEvent))
