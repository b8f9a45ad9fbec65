"""What "lossless" means on each compute path: the measured rounding between a verify forward and plain decoding.

Speculative decoding scores K+1 tokens in one forward; plain decoding scores one token per forward. Both compute the
same function, but the kernels sum in another order for another row count (and the 4-bit CPU kernel casts the
activations to bfloat16), so the logits at the same position differ by rounding. Hence, per path:

  sampling: distribution-exact with respect to the verify forward's logits (the rejection sampler's guarantee);
  greedy:   "identical" to plain decoding token for token where the two forwards were measured bitwise equal, or
            "near-tie": identical except at a position whose top-2 logit gap (plain decoding's logits) is below
            flip_bound.

flip_bound is 2 × the largest |Δlogit| measured between the two forwards (scripts/measure_rounding.py): a flip needs
the top-2 gap g to be overturned, and g ≤ |Δ top-1| + |Δ top-2| ≤ 2 × max |Δlogit|. The figures come from one CPU
(MEASURED_ON); another CPU runs other kernels and may round differently, so a path's bound is a measurement, not a
proof. Paths not measured (CUDA, other compute dtypes) get flip_bound = inf and say so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from localspec.config import ConfigError

GreedyGuarantee = Literal["identical", "near-tie"]
Dtype = Literal["float32", "bfloat16", "float16"]
Quant = Literal["none", "nf4", "int8", "gguf"]
DeviceType = Literal["cpu", "cuda"]

MEASURED_ON = (
    "Intel(R) Xeon(R) Processor (AVX-512 with BF16, FP16 and VNNI; AMX), 1 torch thread, torch 2.13.0+cpu, "
    "transformers 5.24.0, bitsandbytes 0.50.2 without the kernels package"
)
# the paths measured elsewhere than MEASURED_ON
MEASURED_ELSEWHERE = {
    ("cpu", "bfloat16", "gguf"): "AMD EPYC (AVX-512 with BF16 and VNNI), 1 torch thread, torch 2.13.0+cpu, "
    "transformers 5.24.0",
}
MEASUREMENT = "scripts/measure_rounding.py: 10 prompts from ../shared/data × 32 greedy tokens, K+1 ∈ {2, 4, 6, 9}"


@dataclass(frozen=True)
class Rounding:
    """One path's measurement: 1-token vs (K+1)-token forwards of SmolLM2-135M-Instruct at the same positions."""

    max_abs_diff: float  # the largest |Δlogit| at any compared position and token
    flips: int  # positions whose argmax differed between the two forwards
    positions: int  # positions compared (over all K)
    max_flip_gap: float  # the largest top-2 gap (plain decoding's logits) among the flips; 0.0 with none


# (device type, compute dtype, quant) → measurement on MEASURED_ON (raw figures: assets/rounding/*.json)
MEASURED: dict[tuple[str, str, str], Rounding] = {
    ("cpu", "float32", "none"): Rounding(max_abs_diff=4.77e-05, flips=0, positions=1280, max_flip_gap=0.0),
    ("cpu", "bfloat16", "none"): Rounding(max_abs_diff=1.094, flips=29, positions=1280, max_flip_gap=0.25),
    # 3 prompts (2 MT-Bench, 1 HumanEval) only: float16 runs slowly on this CPU
    ("cpu", "float16", "none"): Rounding(max_abs_diff=0.1328, flips=1, positions=384, max_flip_gap=0.0),
    # bitsandbytes' CPU 4-bit kernel (gemv_4bit_inference_cpu_nf4_bf16) casts the activations to bfloat16
    ("cpu", "float32", "nf4"): Rounding(max_abs_diff=0.7775, flips=13, positions=1280, max_flip_gap=0.0462),
    # LLM.int8 picks its outlier columns (|x| > 6) over all rows of a forward: K+1 rows decompose differently
    ("cpu", "float32", "int8"): Rounding(max_abs_diff=12.1, flips=85, positions=1280, max_flip_gap=0.99),
    # quant gguf: the int4 linears are bitwise the same for 1..9 rows (and a row padded to 2); the difference enters
    # at the attention. Measured on an AMD EPYC (MEASURED_ELSEWHERE), not MEASURED_ON's Xeon; the dense
    # bfloat16 path measured 1.05 / 21 flips on the same AMD run (assets/rounding/gguf.json holds both)
    ("cpu", "bfloat16", "gguf"): Rounding(max_abs_diff=1.125, flips=20, positions=1280, max_flip_gap=0.125),
}


@dataclass(frozen=True)
class Guarantee:
    path: str  # e.g. "cpu float32", "cpu nf4 (float32 compute)"
    greedy: GreedyGuarantee
    flip_bound: float  # greedy may differ from plain decoding only where the top-2 logit gap is below this
    measured: bool
    measured_on: str  # the machine, or "not measured"
    text: str  # one sentence for people
    max_abs_diff: float | None = None
    max_flip_gap: float | None = None

    def allows_flip(self, top2_gap: float) -> bool:
        """May speculative greedy output part from plain decoding at a position with this top-2 logit gap?"""
        return self.greedy == "near-tie" and top2_gap < self.flip_bound

    def to_dict(self) -> dict:
        bound = self.flip_bound if math.isfinite(self.flip_bound) else None  # JSON has no infinity
        return {
            "path": self.path,
            "greedy": self.greedy,
            "flip_bound": bound,
            "measured": self.measured,
            "measured_on": self.measured_on,
            "text": self.text,
            "max_abs_diff": self.max_abs_diff,
            "max_flip_gap": self.max_flip_gap,
        }


def path_name(dtype: str, quant: str, device_type: str) -> str:
    return f"{device_type} {dtype}" if quant == "none" else f"{device_type} {quant} ({dtype} compute)"


def _check(dtype: str, quant: str, device_type: str) -> None:
    if dtype not in ("float32", "bfloat16", "float16"):
        raise ConfigError(f"unknown compute dtype {dtype!r}; choose float32, bfloat16 or float16")
    if quant not in ("none", "nf4", "int8", "gguf"):
        raise ConfigError(f"unknown quantization {quant!r}; choose nf4, int8, gguf or none")
    if device_type not in ("cpu", "cuda"):
        raise ConfigError(f"unknown device type {device_type!r}; use cpu or cuda")


def guarantee_for(dtype: str, quant: str, device_type: str) -> Guarantee:
    """The guarantee speculative decoding gives on this compute path (dtype a torch dtype name, quant none / nf4 /
    int8, device_type cpu / cuda)."""
    _check(dtype, quant, device_type)
    path = path_name(dtype, quant, device_type)
    exact = "sampling is distribution-exact with respect to the verify forward's logits"
    rounding = MEASURED.get((device_type, dtype, quant))
    machine = MEASURED_ELSEWHERE.get((device_type, dtype, quant), MEASURED_ON)
    if rounding is None:
        return Guarantee(
            path,
            "near-tie",
            math.inf,
            False,
            "not measured",
            f"{path} (not measured): {exact}; greedy output may part from plain decoding wherever the "
            f"verify forward's rounding flips the top choice, with no measured bound on the gap",
        )
    if rounding.max_abs_diff == 0.0:
        return Guarantee(
            path,
            "identical",
            0.0,
            True,
            machine,
            f"{path}: {exact}; greedy output is identical to plain decoding token for token (the two "
            f"forwards were bitwise equal when measured on {machine}; another CPU may differ)",
            rounding.max_abs_diff,
            rounding.max_flip_gap,
        )
    bound = 2 * rounding.max_abs_diff
    return Guarantee(
        path,
        "near-tie",
        bound,
        True,
        machine,
        f"{path}: {exact}; greedy output is identical to plain decoding except where the top-2 logit "
        f"gap is below {bound:.2g} (2 × the largest logit rounding difference, {rounding.max_abs_diff:.2g}, "
        f"measured on {machine}; another CPU may round differently)",
        rounding.max_abs_diff,
        rounding.max_flip_gap,
    )


def dtype_name(model) -> str:
    """The compute dtype name of a transformers model ('float32', 'bfloat16', ...)."""
    return str(model.dtype).replace("torch.", "")


def guarantee_for_model(model, quant: str, device_type: str) -> Guarantee:
    return guarantee_for(dtype_name(model), quant, device_type)
