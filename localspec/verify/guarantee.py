"""What "lossless" means on each compute path: the measured rounding between a verify forward and plain decoding.

Speculative decoding scores K+1 tokens in one forward; plain decoding scores one token per forward. Both compute the
same function, but a CPU's kernels (and cuBLAS) pick their blocking by the row count, so the logits at the same
position can differ by rounding. The exact forward setup (runtime/model_runner.py exact_setup_for: an explicit
additive mask, dummy rows up to 2 rows in bf16, a multiple of 8 in float32 and of 4 in float16, and decode / verify
attention on the attention kernel where its library loads, else eager) removes that on the paths where it was
measured to. Setups (Setup): fast = transformers' defaults; exact = eager attention; exact-attention = the attention
kernel, torch's or bitsandbytes' linears; exact-kernels = gguf on the q4, q8 and attention kernels. Per path, setup:

  greedy "identical":  every row of 2..17-row chain forwards was measured bitwise equal to the 1-row forward's, so
                       greedy chains (and seeded sampling with one-hot drafts) give plain decoding's tokens; the tests
                       assert == with no bound.
  greedy "near-tie":   rows differed; greedy output may part from plain decoding only at a position whose top-2
                       logit gap (plain decoding's logits) is below flip_bound = the largest top-2 gap among the
                       argmax flips measured + MARGIN_FACTOR × the largest |Δlogit| measured (prompts no test reads,
                       2 torch threads, R = 2..17 and trees: `localspec bench rounding`, assets/rounding/).
  trees:               token trees are stated apart (tree_greedy, tree_flip_bound): a node's ancestors are not
                       contiguous rows, so eager attention's sums run in another order than plain decoding's (the
                       attention kernel's do not).

Sampling is distribution-exact with respect to the verify forward's logits on every path. The figures come from one
CPU (Rounding.measured_on); another CPU runs other kernels, so a path's guarantee is a measurement, not a proof.
Paths not measured (CUDA, another quantization) get flip_bound = inf and say so. The figures are data: each row of
assets/rounding/index.json names the measurement files it pools (localspec/measured.py reads them at import). A new
weight format gets its rows by adding its name to Quant and to localspec/bench/rounding.py PATHS, running
`localspec bench rounding --json-dir assets/rounding/<machine>`, and naming the files in index.json.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from localspec.config import ConfigError
from localspec.measured import Row, rounding_rows
from localspec.runtime.plan import Setup  # the setup ids: the forward plan names them

GreedyGuarantee = Literal["identical", "near-tie"]
Dtype = Literal["float32", "bfloat16", "float16"]
Quant = Literal["none", "nf4", "int8", "gguf"]  # a new weight format adds its name here and its rows to index.json
DeviceType = Literal["cpu", "cuda"]
# Setup (runtime/plan.py) exact-kernels: the exact setup on the row-invariant kernels (q4 linears, q8 head, attention);
# exact-attention: the exact setup with decode / verify attention on the attention kernel, torch's linears
SETUP_WORDS = {
    "fast": "fast",
    "exact": "exact",
    "exact-kernels": "exact (row-invariant kernels)",
    "exact-attention": "exact (attention kernel)",
}
QUANTS: tuple[str, ...] = ("none", "nf4", "int8", "gguf")
MARGIN_FACTOR = 1.0  # the bound's slack beyond the largest flip seen: one largest rounding difference


@dataclass(frozen=True)
class Rounding:
    """One path and setup's measurement: 1-token forwards vs the same rows in multi-row chains and in trees."""

    positions: int  # chain positions compared (over every row count)
    unequal: int  # chain positions whose logits were not bitwise equal
    max_abs_diff: float  # the largest chain |Δlogit|
    flips: int  # chain positions whose argmax differed
    max_flip_gap: float  # the largest top-2 gap (plain decoding's logits) among the chain flips; 0.0 with none
    measured_on: str  # the machine and the sample
    tree_positions: int = 0  # 0: trees not measured on their own
    tree_unequal: int = 0
    tree_max_abs_diff: float = 0.0
    tree_max_flip_gap: float = 0.0

    @classmethod
    def of(cls, row: Row) -> Rounding:
        chains, trees = row.chains, row.trees
        return cls(
            chains.positions,
            chains.unequal,
            chains.max_abs_diff,
            chains.flips,
            chains.max_flip_gap,
            row.measured_on,
            trees.positions,
            trees.unequal,
            trees.max_abs_diff,
            trees.max_flip_gap,
        )


# (device type, compute dtype, quant, setup) → measurement, and per CPU family where a family's figures differ (read
# before MEASURED): assets/rounding/index.json names the measurement files each row pools
MEASURED: dict[tuple[str, str, str, str], Rounding] = {
    (r.device, r.dtype, r.quant, r.setup): Rounding.of(r) for r in rounding_rows() if r.family is None
}
MEASURED_BY_CPU: dict[tuple[str, str, str, str, str], Rounding] = {
    (r.device, r.dtype, r.quant, r.setup, r.family): Rounding.of(r) for r in rounding_rows() if r.family is not None
}
CpuFamily = Literal["amd-epyc", "intel-xeon", "other"]


# a setup not measured on a CPU family is stated by the measurement of the setup it refines there: the attention
# kernel takes attention's rounding differences out of the exact setup and leaves the linears' as they were, so the
# exact setup's measured figures bound it
REFINES: dict[str, str] = {"exact-attention": "exact"}


def measurement(device_type: str, dtype: str, quant: str, setup: str, family: str) -> tuple[Rounding | None, str]:
    """(the measurement that states this path and setup on this CPU family, the setup it was measured in)."""
    for name in (setup, REFINES.get(setup)):
        if name is None:
            continue
        found = MEASURED_BY_CPU.get((device_type, dtype, quant, name, family)) or MEASURED.get(
            (device_type, dtype, quant, name)
        )
        if found is not None:
            return found, name
    return None, setup


def cpu_family() -> CpuFamily:
    """The running CPU's family as the measurements name it (from /proc/cpuinfo's model name)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            name = next((line for line in handle if line.startswith("model name")), "")
    except OSError:
        return "other"
    if "AMD EPYC" in name:
        return "amd-epyc"
    return "intel-xeon" if "Xeon" in name else "other"


@dataclass(frozen=True)
class Guarantee:
    path: str  # e.g. "cpu float32 (exact forwards)", "cpu nf4 (float32 compute, fast forwards)"
    greedy: GreedyGuarantee  # chains (and plain steps)
    flip_bound: float  # greedy chains may differ from plain decoding only where the top-2 logit gap is below this
    measured: bool
    measured_on: str  # the machine, or "not measured"
    text: str  # one sentence for people
    max_abs_diff: float | None = None
    max_flip_gap: float | None = None
    tree_greedy: GreedyGuarantee = "near-tie"
    tree_flip_bound: float = math.inf

    def allows_flip(self, top2_gap: float, tree: bool = False) -> bool:
        """May speculative greedy output part from plain decoding at a position with this top-2 logit gap?"""
        greedy, bound = (self.tree_greedy, self.tree_flip_bound) if tree else (self.greedy, self.flip_bound)
        return greedy == "near-tie" and top2_gap < bound

    @property
    def short(self) -> str:
        """For a column or a status line: 'bitwise identical to plain decoding' or the bound in words."""
        if self.greedy == "identical":
            return "bitwise identical to plain decoding"
        if not self.measured:
            return "may differ from plain decoding (rounding not measured on this path)"
        return f"may differ from plain decoding where the top two logits are within {self.flip_bound:.2g}"

    def to_dict(self) -> dict:
        def finite(x: float) -> float | None:
            return x if math.isfinite(x) else None  # JSON has no infinity

        return {
            "path": self.path,
            "greedy": self.greedy,
            "flip_bound": finite(self.flip_bound),
            "tree_greedy": self.tree_greedy,
            "tree_flip_bound": finite(self.tree_flip_bound),
            "measured": self.measured,
            "measured_on": self.measured_on,
            "text": self.text,
            "short": self.short,
            "max_abs_diff": self.max_abs_diff,
            "max_flip_gap": self.max_flip_gap,
        }


def path_name(dtype: str, quant: str, device_type: str, setup: str = "fast") -> str:
    base = f"{device_type} {dtype}" if quant == "none" else f"{device_type} {quant} ({dtype} compute)"
    return f"{base}, {SETUP_WORDS.get(setup, setup)} forwards"


def _check(dtype: str, quant: str, device_type: str) -> None:
    if dtype not in ("float32", "bfloat16", "float16"):
        raise ConfigError(f"unknown compute dtype {dtype!r}; choose float32, bfloat16 or float16")
    if quant not in QUANTS:
        raise ConfigError(f"unknown quantization {quant!r}; choose one of {', '.join(QUANTS)}")
    if device_type not in ("cpu", "cuda"):
        raise ConfigError(f"unknown device type {device_type!r}; use cpu or cuda")


def bound(max_flip_gap: float, max_abs_diff: float) -> float:
    """The largest flip gap seen plus the margin (MARGIN_FACTOR × the largest rounding difference seen)."""
    return max_flip_gap + MARGIN_FACTOR * max_abs_diff


def guarantee_for(
    dtype: str, quant: str, device_type: str, setup: Setup = "fast", cpu: CpuFamily | None = None
) -> Guarantee:
    """The guarantee speculative decoding gives on this compute path (dtype a torch dtype name, quant none / nf4 /
    int8 / gguf, device_type cpu / cuda, setup: the target's forward setup as setup_name names it; cpu: the CPU
    family whose measurement applies, the running one by default)."""
    _check(dtype, quant, device_type)
    if setup not in SETUP_WORDS:
        raise ConfigError(f"unknown forward setup {setup!r}; choose one of {', '.join(SETUP_WORDS)}")
    path = path_name(dtype, quant, device_type, setup)
    sampling = "sampling is distribution-exact with respect to the verify forward's logits"
    family = (cpu or cpu_family()) if device_type == "cpu" else "other"
    rounding, measured_in = measurement(device_type, dtype, quant, setup, family)
    if rounding is None:
        return Guarantee(
            path,
            "near-tie",
            math.inf,
            False,
            "not measured",
            f"{path} (not measured): {sampling}; greedy output may part from plain decoding wherever the "
            f"verify forward's rounding flips the top choice, with no measured bound on the gap",
        )
    chain_bound = 0.0 if rounding.unequal == 0 else bound(rounding.max_flip_gap, rounding.max_abs_diff)
    greedy: GreedyGuarantee = "identical" if rounding.unequal == 0 else "near-tie"
    if rounding.tree_positions == 0:  # trees not measured apart: the chain figures stand for them
        tree_greedy, tree_bound = greedy, chain_bound
    elif rounding.tree_unequal == 0:
        tree_greedy, tree_bound = "identical", 0.0
    else:
        tree_greedy, tree_bound = "near-tie", bound(rounding.tree_max_flip_gap, rounding.tree_max_abs_diff)
    if greedy == "identical":
        chains = (
            f"greedy chains are bitwise identical to plain decoding token for token (every row of multi-row "
            f"forwards equalled the 1-row forward's, {rounding.positions} positions)"
        )
    else:
        chains = (
            f"greedy output may part from plain decoding only where the top two logits are within {chain_bound:.2g} "
            f"(the largest flip seen, {rounding.max_flip_gap:.2g}, plus the largest rounding difference, "
            f"{rounding.max_abs_diff:.2g}"
            + (f"; {rounding.unequal} of {rounding.positions} rows differed)" if rounding.unequal else ")")
        )
    if tree_greedy == "identical":
        trees = "token trees too"
    else:
        trees = f"token trees may part where the top two logits are within {tree_bound:.2g}"
        if rounding.tree_positions:
            flips = "no flip seen" if rounding.tree_max_flip_gap == 0 else "flips seen"
            trees += f" ({rounding.tree_unequal} of {rounding.tree_positions} tree rows differed, {flips})"
    where = {
        "exact-kernels": "by construction wherever the kernels pass their load-time checks",
        "exact-attention": "the attention by construction, the linears as measured: another CPU may round differently",
    }.get(setup, "another CPU may round differently")
    if measured_in != setup:  # stated by the setup it refines (REFINES)
        where = f"the {SETUP_WORDS[measured_in]} setup's measurement: {SETUP_WORDS[setup]} not measured on this CPU"
    return Guarantee(
        path,
        greedy,
        chain_bound,
        True,
        rounding.measured_on,
        f"{path}: {sampling}; {chains}; {trees} (measured on {rounding.measured_on}; {where})",
        rounding.max_abs_diff,
        rounding.max_flip_gap,
        tree_greedy,
        tree_bound,
    )


def dtype_name(model) -> str:
    """The compute dtype name of a transformers model ('float32', 'bfloat16', ...)."""
    return str(model.dtype).replace("torch.", "")


def setup_name(model, exact: bool) -> Setup:
    """The measurement a target's forwards fall under: its forward plan's setup id (runtime/plan.py)."""
    from localspec.runtime.plan import plan_forward

    return plan_forward(model, exact=exact).setup_id


def guarantee_for_model(model, quant: str, device_type: str, exact: bool = False) -> Guarantee:
    return guarantee_for(dtype_name(model), quant, device_type, setup_name(model, exact))
