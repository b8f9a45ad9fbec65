"""Q8_0-layout matmuls run as the file stores them: the LM head of a GGUF whose token embedding (tied to the LM head)
is Q8_0 (`Q8Head`), and a decoder layer's Q8_0 or Q5_0 linear (`Q8Linear`).

SmolLM2's 49,152 × 576 LM head is the largest matmul of a step: 57 MB as the dense bfloat16 weight the model loads,
30 MB as the file's Q8_0 blocks (32 int8 codes and a float16 scale d each: w = q·d). `Q8Head` runs the q8 matmul of
the q4 kernel's library (kernels/q8_matmul.c) on those blocks: the file's exact weights (the dense copy rounds q·d
to bfloat16), float32 logits, and a row's logits the same whatever the other rows of the call (one thread sums an
output in one order). On a CPU where oneDNN cannot prepack bf16 (AVX2 only) the dense head re-packs its 57 MB in
every call, so there this is the difference between most of a step and a small part of it.

The dense weight stays in the model (it is the token embedding, and a head proposer reads it); the loader records the
Q8Head with the model (plan.record_load) and the forward plan makes it the runner's LM head.

`Q8Linear` is the same matmul as a decoder linear: int8 codes with a float16 scale per 32 weights (Q8_0: w = q·d;
Q5_0: w = d·(q − 16), whose q − 16 in −16..15 is an int8 code), or on the q8k matmul with a float32 scale and offset
per 16 (Q6_K, Q5_K, Q5_1: `from_q8k`; `scales` then holds d and m), float32 sums rounded to the bfloat16 the layers
compute in (an elementwise rounding: a row still does not depend on the other rows). The layer kernel reads its codes
and scales in place (layer_kernel.LinearPart) and rounds its sums the same way.
"""

from __future__ import annotations

import torch
from torch import nn

from .q4_kernel import Q6KMatmul, Q8KMatmul, Q8Matmul, pack_q6k, pack_q8, pack_q8k


class Q8Head(nn.Module):
    """y = x · Wᵀ for W [N, K] as Q8_0 codes in groups of 32 along K; x bf16 → float32 logits. No bias."""

    def __init__(self, codes: torch.Tensor, scales: torch.Tensor, in_features: int, kernel: Q8Matmul) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, codes.shape[0] * codes.shape[3]
        self.kernel = kernel
        self.register_buffer("codes", codes)  # [N/16, K/32, 8, 16, 4] int8 (q4_kernel.pack_q8)
        self.register_buffer("scales", scales)  # [N/16, K/32, 16] float16

    @classmethod
    def from_q8_0(cls, codes: torch.Tensor, d: torch.Tensor, kernel: Q8Matmul) -> Q8Head:
        """From a Q8_0 tensor's fields: codes [N, K] int8, d [N, K/32] float16."""
        packed, scales = pack_q8(codes, d)
        return cls(packed, scales, codes.shape[1], kernel)

    @classmethod
    def from_q8k(cls, codes: torch.Tensor, d: torch.Tensor, m: torch.Tensor, kernel: Q8KMatmul) -> Q8Head:
        """On the q8k matmul: codes [N, K] int8, d and m [N, K/16] float32 (w = d·q + m: Q6_K, Q5_K, Q5_1)."""
        packed, dm = pack_q8k(codes, d, m)
        return cls(packed, dm, codes.shape[1], kernel)

    @classmethod
    def from_q6k(cls, fields, kernel: Q6KMatmul) -> Q8Head:
        """On the q6k matmul: a Q6_K tensor's fields as stored (models/gguf_linear.Q6KFields)."""
        packed, scales = pack_q6k(fields.codes, fields.d, fields.sc)
        return cls(packed, scales, fields.codes.shape[1], kernel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [..., K] bf16 → [..., N] float32
        buffers = self._buffers
        return self.kernel.matmul(x, buffers["codes"], buffers["scales"], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, Q8_0 group 32"


class Q8Linear(Q8Head):
    """A decoder linear on the q8 matmul: x [..., K] bf16 → [..., N] bf16 (the float32 sums rounded once)."""

    row_invariant = True  # one thread sums each output in one order whatever the row count (q8_matmul.c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [..., K] bf16 → [..., N] bf16
        return super().forward(x).to(torch.bfloat16)

    @classmethod
    def concatenated(cls, layers: list[Q8Linear]) -> Q8Linear | None:
        """One layer computing `layers`' outputs side by side (blocks of 16 outputs stack as they are), or None
        when their inputs or kernels differ."""
        if len({layer.in_features for layer in layers}) != 1 or len({id(layer.kernel) for layer in layers}) != 1:
            return None
        codes = torch.cat([layer.codes for layer in layers])  # [ΣN/16, K/32, 8, 16, 4]
        scales = torch.cat([layer.scales for layer in layers])  # [ΣN/16, K/32, 16]
        return cls(codes, scales, layers[0].in_features, layers[0].kernel)

    def share_with(self, parts: list[Q8Linear]) -> None:
        """Rebind `parts` to views of this layer's codes and scales, so they are kept once."""
        sizes = [part.out_features // part.codes.shape[3] for part in parts]
        for part, codes, scales in zip(parts, self.codes.split(sizes), self.scales.split(sizes), strict=True):
            part.codes, part.scales = codes, scales

    def extra_repr(self) -> str:
        group, kind = self.codes.shape[2] * self.codes.shape[4], self.kernel.KIND
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 codes group {group}, {kind}"
