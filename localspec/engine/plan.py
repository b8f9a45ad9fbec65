"""What a step is told to run (StepPlan) and what it measured (StepOutcome): the plain values that pass between the
policy (policy.py), which decides and learns, and the step (step.py), which runs. The loop (loop.py) carries them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

Shape = Literal["plain", "chain", "tree"]


@dataclass(frozen=True)
class StepPlan:
    """One step's shape and size: plain (0), a chain of `size` draft tokens, or a token tree of `size` nodes."""

    shape: Shape
    size: int

    @classmethod
    def chain(cls, k: int) -> StepPlan:
        """A chain of k draft tokens; a plain step when k is 0."""
        return cls("chain", k) if k > 0 else PLAIN


PLAIN = StepPlan("plain", 0)


@dataclass(frozen=True, kw_only=True)
class StepOutcome:
    """What one step drafted, kept, emitted and cost: what the policy learns from (policy.observe) and what the
    answer's statistics fold in (Run.record)."""

    drafted: int  # draft tokens (chain) or tree nodes the proposer returned
    num_accepted: int  # of which the target kept this many
    emitted: int  # tokens the step emitted (up to a stop token)
    propose_s: float
    score_s: float  # the target forward
    sampler_s: float  # verification and its host reads
    room: int  # draft tokens the answer's token budget allowed this step (max_new - produced - 1)
    whole: bool = True  # a tree the token budget did not cut
    depth: Optional[int] = None  # a tree's depth; None for a chain
    first_branch: Optional[tuple[int, int]] = None  # a greedy tree's first branch: (its length, how many kept)
    dropped: bool = False  # the proposer's draft had NaN / infinite probabilities: the step ran plain

    @property
    def verify_s(self) -> float:
        return self.score_s + self.sampler_s
