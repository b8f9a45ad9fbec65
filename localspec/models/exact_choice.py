"""`exact: auto`: run the target's forwards in the exact setup (engine/model_runner.py exact_setup: eager attention, an
explicit additive mask, at least 2 rows per forward, multiples of 8 in float32 and 4 in float16) where its measured
cost is small.

In the exact setup a bfloat16 row's logits were measured bitwise equal whether the row is computed alone (plain
decoding) or inside a 2..17-row verify forward (`localspec bench rounding`, assets/rounding/epyc/), so greedy
speculative chains are plain decoding's token for token (float32 / float16 come closer, not bitwise:
verify/guarantee.py). It costs a dummy row on each 1-token forward and eager attention instead of
sdpa; a model whose decoder linears are all row-invariant (gguf on the q4 kernel) needs no dummy row and runs its
decode / verify attention on the attention kernel (model_runner.exact_setup_for), which is faster than eager
attention and, on the Zen 3 EPYC, than the fast setup too. At the first load of a model on a machine
both setups are timed on the loaded target (the median of interleaved 1-token and (K+1)-token forwards on a
64-token cache, as dtype_choice.py times dtypes); the exact setup is the default when neither forward costs more
than MAX_COST times the fast one. Where the forward plan knows the answer (runtime/plan.py exact_cost: the exact setup
on the row-invariant kernels throughout, exact-kernels) nothing is timed and nothing is written: the exact setup is
on, with the plan's reason. The decision is cached beside the dtype decision (same key, plus the dtype and the
exact setup's name, so a machine whose kernels change times it again), and later loads time nothing. models.yaml
`exact: true` / `false` (or the CLI's --exact on / off) sets it without measuring.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

from .decision_cache import read_decisions, write_decision
from .dtype_choice import cache_key, time_forwards

ExactSetting = Literal["auto", "on", "off"]
EXACT_SETTINGS: tuple[str, ...] = ("auto", "on", "off")
MAX_COST = 1.25  # the exact setup is the default when its forwards take at most this many times the fast ones
CACHE_FILE = "exact-decisions.json"
CACHE_VERSION = 1

How = Literal["entry", "plan", "measured", "cached"]


@dataclass(frozen=True)
class ExactDecision:
    """Whether the target's forwards run in the exact setup, and why. how: entry (models.yaml / CLI), plan (known
    from the forward plan without timing: `reason`), measured (at this load), cached (at an earlier load on this
    machine). plain_cost / verify_cost: exact ÷ fast time of a 1-token and a (K+1)-token forward (0.0 when not
    measured)."""

    on: bool
    how: How
    plain_cost: float = 0.0
    verify_cost: float = 0.0
    k: int = 0
    measured_on: str = ""  # YYYY-MM-DD
    reason: str = ""  # how == "plan": the forward plan's reason

    def describe(self) -> str:
        """e.g. 'exact forwards on (auto: 1-token 1.09×, 5-token 1.02× the fast setup, measured 2026-12-01)'."""
        state = "on" if self.on else "off"
        if self.how == "entry":
            return f"exact forwards {state} (set in models.yaml or on the command line)"
        if self.how == "plan":
            return f"exact forwards {state} (auto: {self.reason})"
        return (
            f"exact forwards {state} (auto: 1-token {self.plain_cost:.2f}×, {self.k + 1}-token {self.verify_cost:.2f}× "
            f"the fast setup's time, measured {self.measured_on}; on when ≤ {MAX_COST}×)"
        )

    def to_dict(self) -> dict:
        return {
            "on": self.on,
            "how": self.how,
            "plain_cost": self.plain_cost,
            "verify_cost": self.verify_cost,
            "k": self.k,
            "measured_on": self.measured_on,
            "text": self.describe(),
        }

    @classmethod
    def from_dict(cls, data: dict) -> ExactDecision:
        return cls(
            bool(data["on"]),
            "cached",
            float(data["plain_cost"]),
            float(data["verify_cost"]),
            int(data["k"]),
            str(data["measured_on"]),
        )


def _read_cache() -> dict:
    return read_decisions(CACHE_FILE, CACHE_VERSION)


def _write_cache(key: str, decision: ExactDecision) -> None:
    write_decision(CACHE_FILE, CACHE_VERSION, key, decision.to_dict())


def measure_cost(model: torch.nn.Module, k: int, timer=time_forwards) -> tuple[float, float]:
    """(exact ÷ fast for a 1-token forward, the same for a (K+1)-token forward), timed interleaved on `model`."""
    from localspec.runtime.plan import FAST, exact_setup_for

    times = timer({"fast": model, "exact": model}, (1, k + 1), {"fast": FAST, "exact": exact_setup_for(model)})
    return times["exact"][1] / times["fast"][1], times["exact"][k + 1] / times["fast"][k + 1]


def choose_exact(
    setting: ExactSetting,
    model: torch.nn.Module,
    source: str,
    folder: str,
    k: int,
    device: torch.device,
    timer=None,
    say: Callable[[str], None] | None = None,
) -> ExactDecision:
    """The decision for the loaded target: the setting when it is on / off, else the plan's where it knows the cost
    (exact_cost), else the cached or measured one (`say` is told before anything is timed)."""
    if setting != "auto":
        return ExactDecision(setting == "on", "entry")
    from localspec.runtime.plan import exact_cost, plan_forward

    dtype = str(model.dtype).replace("torch.", "")
    exact = plan_forward(model, exact=True)
    cost = exact_cost(exact)
    if cost.value == "known":
        return ExactDecision(True, "plan", reason=cost.reason)
    # another setup: timed anew
    key = f"{cache_key(device, source, folder)} | {dtype} | {exact.setup_id}: {exact.setup.describe()}"
    raw = _read_cache().get(key)
    if raw is not None:
        try:
            return ExactDecision.from_dict(raw)
        except (KeyError, TypeError, ValueError):
            pass
    if say is not None:
        say("Timing the exact forward setup against the fast one (once per machine)…")
    plain, verify = measure_cost(model, k, timer or time_forwards)
    decision = ExactDecision(max(plain, verify) <= MAX_COST, "measured", plain, verify, k, time.strftime("%Y-%m-%d"))
    _write_cache(key, decision)
    return decision
