"""The speculative speedup model shared by the adaptive controller (engine/adaptive.py) and the load-time dtype
choice (models/dtype_choice.py): tokens per step E(K) and speedup(K) = E(K) / (K·c + v(K)). Pure Python."""

from __future__ import annotations

PRIOR_ACCEPTANCE = 0.5  # prior acceptance per draft position, before anything is measured


def expected_tokens(acceptance: list[float], k: int) -> float:
    """E(K) = 1 + Σ_{i≤K} Π_{j≤i} a_j: tokens emitted per step with K drafts (the bonus / resampled one counts)."""
    total, reach = 1.0, 1.0
    for a in acceptance[:k]:
        reach *= a
        total += reach
    return total


def predicted_speedups(acceptance: list[float], draft_c: float, verify: list[float]) -> list[float]:
    """speedup[K] = E(K) / (K·c + v(K)) for K = 0 … len(verify) - 1 (speedup[0] is 1 by definition)."""
    return [expected_tokens(acceptance, k) / (k * draft_c + verify[k]) if k else 1.0 for k in range(len(verify))]
