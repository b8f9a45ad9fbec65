"""The LM head of a GGUF whose token embedding (tied to the LM head) is Q8_0, run as the file stores it.

SmolLM2's 49,152 × 576 LM head is the largest matmul of a step: 57 MB as the dense bfloat16 weight the model loads,
30 MB as the file's Q8_0 blocks (32 int8 codes and a float16 scale d each: w = q·d). `Q8Head` runs the q8 matmul of
the q4 kernel's library (kernels/q8_matmul.c) on those blocks: the file's exact weights (the dense copy rounds q·d
to bfloat16), float32 logits, and a row's logits the same whatever the other rows of the call (one thread sums an
output in one order). On a CPU where oneDNN cannot prepack bf16 (AVX2 only) the dense head re-packs its 57 MB in
every call, so there this is the difference between most of a step and a small part of it.

The dense weight stays in the model (it is the token embedding, and a head proposer reads it); the loader records the
Q8Head with the model (plan.record_load) and the forward plan makes it the runner's LM head.
"""

from __future__ import annotations

import torch
from torch import nn

from .q4_kernel import Q8Matmul, pack_q8


class Q8Head(nn.Module):
    """y = x · Wᵀ for W [N, K] as Q8_0 codes in groups of 32 along K; x bf16 → float32 logits. No bias."""

    def __init__(self, codes: torch.Tensor, scales: torch.Tensor, in_features: int, kernel: Q8Matmul) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, codes.shape[0] * codes.shape[3]
        self.kernel = kernel
        self.register_buffer("codes", codes)  # [N/16, K/32, 32, 16] int8 (q4_kernel.pack_q8)
        self.register_buffer("scales", scales)  # [N/16, K/32, 16] float16

    @classmethod
    def from_q8_0(cls, codes: torch.Tensor, d: torch.Tensor, kernel: Q8Matmul) -> Q8Head:
        """From a Q8_0 tensor's fields: codes [N, K] int8, d [N, K/32] float16."""
        packed, scales = pack_q8(codes, d)
        return cls(packed, scales, codes.shape[1], kernel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [..., K] bf16 → [..., N] float32
        buffers = self._buffers
        return self.kernel.matmul(x, buffers["codes"], buffers["scales"], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, Q8_0 group 32"
