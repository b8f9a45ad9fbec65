"""What greedy speculative output promises against plain decoding, per path (target dtype, quantization, device).

A verify forward scores K+1 positions in one pass; plain decoding scores one. The two round differently, so a greedy
flip is possible exactly where the target's top-2 logit gap is within the rounding difference. `flip_bound` is that
gap: a flip is allowed only where the target's top-2 gap < flip_bound.

The values are 4x the largest |logit difference| between a 4-token verify forward and 4 one-token steps, measured on
a 2-layer random Qwen2-shaped model at V = 152,064 on a CPU (8 random contexts per cell; float32 2.9e-6, bfloat16 0,
float16 3.9e-3, the same with nf4 and int8). bfloat16 measured 0 there; its bound is one bf16 step at |logit| 8-16.
Paths not measured (CUDA) get the widest bound until they are.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Guarantee:
    greedy: Literal["identical", "near-tie"]
    flip_bound: float  # a greedy flip is allowed only where the target's top-2 logit gap < flip_bound
    measured: bool  # False: a conservative bound for a path nobody measured yet


_CPU_BOUNDS = {"float32": 1.2e-5, "bfloat16": 0.0625, "float16": 0.0157}
_UNMEASURED = Guarantee("near-tie", 0.125, measured=False)


def guarantee_for(dtype: str, quant: str, device_type: str) -> Guarantee:
    """dtype: float32 | bfloat16 | float16 (the resolved compute dtype); quant: none | nf4 | int8; device_type:
    cpu | cuda."""
    if device_type == "cpu" and dtype in _CPU_BOUNDS and quant in ("none", "nf4", "int8"):
        return Guarantee("near-tie", _CPU_BOUNDS[dtype], measured=True)
    return _UNMEASURED
