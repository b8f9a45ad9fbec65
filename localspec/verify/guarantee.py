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
                       2 torch threads, R = 2..17 and trees: scripts/measure_rounding.py, assets/rounding/).
  trees:               token trees are stated apart (tree_greedy, tree_flip_bound): a node's ancestors are not
                       contiguous rows, so eager attention's sums run in another order than plain decoding's (the
                       attention kernel's do not).

Sampling is distribution-exact with respect to the verify forward's logits on every path. The figures come from one
CPU (Rounding.measured_on); another CPU runs other kernels, so a path's guarantee is a measurement, not a proof.
Paths not measured (CUDA, another quantization) get flip_bound = inf and say so. A new weight format (e.g. GGUF int4
kept packed) gets its rows by adding its name to Quant and scripts/measure_rounding.py PATHS, running the script,
and adding MEASURED rows for each setup.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from localspec.config import ConfigError
from localspec.runtime.plan import Setup  # the setup ids: the forward plan names them

GreedyGuarantee = Literal["identical", "near-tie"]
Dtype = Literal["float32", "bfloat16", "float16"]
Quant = Literal["none", "nf4", "int8", "gguf"]  # a new weight format adds its name here and its MEASURED rows below
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

EPYC = "AMD EPYC (2 cores), 2 torch threads, torch 2.13.0+cpu, transformers 5.24.0"
ZEN4 = (
    "AMD EPYC Zen 4 (2 cores, AVX-512 BF16), 2 torch threads, torch 2.13.0+cpu, transformers 5.24.0, bitsandbytes "
    "0.50.2 without the kernels package; 5 prompts no test reads × 24 tokens, R = 2..17, trees of 7 / 17 rows"
)
ZEN3 = "AMD EPYC Zen 3 (2 cores, AVX2, no AVX-512), 2 torch threads, torch 2.13.0+cpu, transformers 5.24.0"


@dataclass(frozen=True)
class Rounding:
    """One path and setup's measurement: 1-token forwards vs the same rows in multi-row chains and in trees."""

    positions: int  # chain positions compared (over every row count)
    unequal: int | None  # chain positions whose logits were not bitwise equal (None: not counted, only max |Δ| > 0)
    max_abs_diff: float  # the largest chain |Δlogit|
    flips: int  # chain positions whose argmax differed
    max_flip_gap: float  # the largest top-2 gap (plain decoding's logits) among the chain flips; 0.0 with none
    measured_on: str  # the machine and the sample
    tree_positions: int = 0  # 0: trees not measured on their own
    tree_unequal: int = 0
    tree_max_abs_diff: float = 0.0
    tree_max_flip_gap: float = 0.0


# (device type, compute dtype, quant, setup) → measurement (raw figures: assets/rounding/; epyc/ for the exact setup)
MEASURED: dict[tuple[str, str, str, str], Rounding] = {
    # fast (sdpa, 1-row decode forwards) on the AVX-512 EPYC, 2026-12-04 (scripts/measure_rounding.py --paths
    # bfloat16,float32,float16,nf4,int8 --setups fast,exact: 3 gsm8k + 1 MT-Bench + 1 HumanEval prompts no test
    # reads; assets/rounding/epyc/<path>.json). The earlier Intel Xeon figures (1 thread, the tests' own 10 prompts,
    # K+1 ∈ {2, 4, 6, 9}: assets/rounding/<path>.json) lie within these bounds: bf16 1.09 with flips at gaps ≤ 0.25,
    # nf4 0.78 (≤ 0.046), int8 12.1 (≤ 0.99: its bound is no greedy identity either way), float32 4.8e-05.
    ("cpu", "float32", "none", "fast"): Rounding(1920, 1920, 8.39e-05, 0, 0.0, ZEN4, 240, 240, 7.53e-05, 0.0),
    ("cpu", "bfloat16", "none", "fast"): Rounding(1920, 1902, 1.125, 0, 0.0, ZEN4, 240, 240, 0.954, 0.0),
    ("cpu", "float16", "none", "fast"): Rounding(1920, 1859, 0.1255, 0, 0.0, ZEN4, 240, 240, 0.1035, 0.0),
    # bitsandbytes' CPU 4-bit kernel (gemv_4bit_inference_cpu_nf4_bf16) casts the activations to bfloat16
    ("cpu", "float32", "nf4", "fast"): Rounding(1920, 1920, 0.5666, 25, 0.0667, ZEN4, 240, 240, 0.5104, 0.0667),
    # LLM.int8 picks its outlier columns (|x| > 6) over all rows of a forward: K+1 rows decompose differently
    ("cpu", "float32", "int8", "fast"): Rounding(1920, 1920, 5.23, 69, 0.5365, ZEN4, 240, 240, 4.592, 0.4501),
    # quant gguf (the file's Q4_1 blocks, bf16 compute) on the q4 kernel, whose linears are row-invariant by
    # construction: the difference enters at sdpa's attention. Two samples pooled (the same 3 gsm8k + 1 MT-Bench +
    # 1 HumanEval prompts no test reads × 24 tokens, R = 2..17, trees of 7 / 17 rows): the AVX-512 EPYC with the
    # dense bf16 LM head, 1,887 / 1,920 chain rows unequal, max 1.06, 1 flip at gap 0.125, trees ≤ 1.125
    # (assets/rounding/epyc/gguf-q4-kernel.json); the Zen 3 EPYC (AVX2 build, the q8 LM head), 1,909 / 1,920,
    # max 1.29, 23 flips at gaps ≤ 0.058, trees ≤ 1.03 with 3 flips at ≤ 0.058 (epyc-zen3/gguf-kernels.json, setup
    # fast). The earlier torch-kernel run (1 thread, 10 prompts × 32 tokens): 1.125, 20 flips, largest gap 0.125
    # (assets/rounding/gguf.json)
    ("cpu", "bfloat16", "gguf", "fast"): Rounding(
        3840,
        3796,
        1.2866,
        24,
        0.125,
        "AMD EPYC (AVX-512) and " + ZEN3 + "; 5 prompts × 24 tokens each, q4 kernel",
        480,
        480,
        1.125,
        0.0584,
    ),
    # exact (eager + explicit mask + dummy rows) where the attention kernel is not there, the same sample: chains
    # bitwise in bf16 only; what is left is eager attention, whose sums over keys MKL / oneDNN block by the key
    # count (the first tensor to differ is o_proj's input, on a 206-token prompt in float32) and, in trees, by
    # where the siblings sit (scripts/measure_rounding.py --setups exact; assets/rounding/epyc/<path>.json)
    ("cpu", "bfloat16", "none", "exact"): Rounding(1920, 0, 0.0, 0, 0.0, ZEN4, 240, 61, 0.6875, 0.0),
    ("cpu", "float32", "none", "exact"): Rounding(1920, 377, 6.48e-05, 0, 0.0, ZEN4, 240, 231, 5.72e-05, 0.0),
    ("cpu", "float16", "none", "exact"): Rounding(1920, 95, 0.0781, 0, 0.0, ZEN4, 240, 222, 0.1172, 0.0),
    ("cpu", "float32", "nf4", "exact"): Rounding(1920, 269, 0.3568, 0, 0.0, ZEN4, 240, 184, 0.4162, 0.0298),
    ("cpu", "float32", "int8", "exact"): Rounding(1920, 1920, 6.097, 96, 0.6861, ZEN4, 240, 240, 5.169, 0.2767),
    # gguf in the exact setup with 1-row decode forwards (exact_setup_for: the q4 kernel's linears are row-invariant,
    # so no dummy row): chains bitwise, trees not (assets/rounding/epyc/gguf-q4-kernel.json, the sample above; with a
    # dummy row the same figures). torch's int4 kernel with 1-row forwards: chains bitwise too, 84 of 224 tree rows
    # unequal, ≤ 0.67 (gguf-torch-int4-1row.json); its setup keeps the dummy row (not row-invariant by construction)
    ("cpu", "bfloat16", "gguf", "exact"): Rounding(
        1920, 0, 0.0, 0, 0.0, EPYC + "; 5 prompts × 24 tokens, q4 kernel", 240, 59, 0.875, 0.0
    ),
    # gguf in the exact setup on the row-invariant kernels (exact_setup_for where the q4 kernel's library also loaded
    # the attention kernel; the LM head on its q8 kernel): every linear, the LM head and every decode / verify
    # attention compute a row the same whatever the other rows, so chains and trees are plain decoding's by
    # construction wherever the kernels pass their self-checks; measured on the Zen 3 EPYC (AVX2 build), where eager
    # attention alone left 315 of 1,920 chain rows and 124 of 240 tree rows unequal (assets/rounding/epyc-zen3/:
    # gguf-kernels.json, gguf-q4-avx2-eager.json; the sample above; gguf-kernels-dense-head.json: the same 0 / 2,160
    # with the dense bf16 LM head)
    ("cpu", "bfloat16", "gguf", "exact-kernels"): Rounding(
        1920, 0, 0.0, 0, 0.0, ZEN3 + "; 5 prompts × 24 tokens, q4 kernel (avx2) + attention kernel", 240, 0, 0.0, 0.0
    ),
}

CpuFamily = Literal["amd-epyc", "intel-xeon", "other"]
XEON_2T = "Intel(R) Xeon(R) Processor (Sapphire Rapids: AVX-512 BF16/FP16, AMX), 2 torch threads, torch 2.13.0+cpu"
# measurements that differ by CPU family: (device type, dtype, quant, setup, family) → measurement, read before
# MEASURED. On the Sapphire Rapids Xeon the exact setup's chains are not all bitwise (oneDNN picks the attention
# matmuls' blocking by shape, the row count and the key count among it): exact_rows_setup
# made them (and trees) bitwise there, 0 of 1,152 (assets/rounding/xeon/, 2 gsm8k + 1 MT-Bench + 1 HumanEval
# prompts no test reads × 16 tokens, R = 2..17, trees of 7 / 17 rows)
MEASURED_BY_CPU: dict[tuple[str, str, str, str, str], Rounding] = {
    # exact with decode / verify attention on the attention kernel (exact_setup_for where the loader attached it:
    # any CPU target off the q4 kernel), measured on the AVX-512 EPYC only (MEASURED's sample; another family reads
    # the exact setup's row: REFINES): every chain row and tree row bitwise for bf16, float32, float16 and nf4 (the
    # linears with their dummy rows were already row-invariant here; the attention was the rest). int8 stays
    # inexact: its outlier columns depend on every row (scripts/measure_rounding.py --setups engine;
    # assets/rounding/epyc/<path>-attention-kernel.json)
    ("cpu", "bfloat16", "none", "exact-attention", "amd-epyc"): Rounding(1920, 0, 0.0, 0, 0.0, ZEN4, 240, 0, 0.0, 0.0),
    ("cpu", "float32", "none", "exact-attention", "amd-epyc"): Rounding(1920, 0, 0.0, 0, 0.0, ZEN4, 240, 0, 0.0, 0.0),
    ("cpu", "float16", "none", "exact-attention", "amd-epyc"): Rounding(1920, 0, 0.0, 0, 0.0, ZEN4, 240, 0, 0.0, 0.0),
    ("cpu", "float32", "nf4", "exact-attention", "amd-epyc"): Rounding(1920, 0, 0.0, 0, 0.0, ZEN4, 240, 0, 0.0, 0.0),
    ("cpu", "float32", "int8", "exact-attention", "amd-epyc"): Rounding(
        1920, 1920, 5.141, 66, 0.6176, ZEN4, 240, 240, 5.157, 0.4576
    ),
    ("cpu", "bfloat16", "none", "exact", "intel-xeon"): Rounding(
        1024, 43, 0.8828, 0, 0.0, XEON_2T + "; 4 prompts × 16 tokens", 128, 58, 0.6875, 0.0
    ),
    ("cpu", "bfloat16", "gguf", "exact", "intel-xeon"): Rounding(
        1024, 319, 0.5781, 0, 0.0, XEON_2T + "; 4 prompts × 16 tokens", 128, 79, 0.7031, 0.0
    ),
}


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
