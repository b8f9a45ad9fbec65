"""A linear layer whose weights are 4-bit codes in groups of 32, run by torch's CPU int4 weight-only kernel
(`_weight_int4pack_mm_for_cpu`): w = (q − 8)·scale + zero per group of 32 weights along K. Its fast path wants
bfloat16 activations, scales and zeros (float32 activations take a path ~100× slower here). models/gguf_linear.py
builds these from a GGUF's Q4_1 blocks; the lean forward (lean_llama.py) fuses them.
"""

from __future__ import annotations

import torch
from torch import nn

GROUP = 32  # weights per scale/zero group
COMPUTE_DTYPE = torch.bfloat16  # the kernel's fast path: bf16 activations, scales and zeros
ROW_MULTIPLE = 16  # the kernel's packing wants N (output rows) divisible by 16; other layers stay dense
PACK_BLOCK_ROWS = 64  # the CPU packing interleaves output rows in blocks of 64: packed layers stack at multiples of it
INNER_K_TILES = 1  # argument of _convert_weight_to_int4pack_for_cpu; the CPU kernel ignores it for the layout


class Int4Linear(nn.Module):
    """y = x · Wᵀ with W [N, K] as 4-bit codes in groups of 32 along K: w = (q − 8)·scale + zero, bf16 compute.
    No bias (llama's linears have none)."""

    def __init__(self, packed: torch.Tensor, scales_zeros: torch.Tensor, in_features: int, out_features: int):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.register_buffer("packed", packed)  # [N, K/2] uint8, the kernel's layout
        self.register_buffer("scales_zeros", scales_zeros)  # [K/32, N, 2] bf16: scale, zero

    @classmethod
    def from_codes(cls, codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor) -> Int4Linear:
        """From codes [N, K] int32 in 0..15 and per-group scales and zeros [N, K/32] (w = (q − 8)·scale + zero)."""
        rows, k = codes.shape
        if rows % ROW_MULTIPLE:
            raise ValueError(f"the int4 kernel packs {ROW_MULTIPLE}·n output rows; this layer has {rows}")
        packed = torch._convert_weight_to_int4pack_for_cpu(codes, INNER_K_TILES)
        scales_zeros = torch.stack([scales, zeros], dim=-1).transpose(0, 1).contiguous().to(COMPUTE_DTYPE)  # [G, N, 2]
        return cls(packed, scales_zeros, k, rows)

    @classmethod
    def concatenated(cls, layers: list[Int4Linear]) -> Int4Linear | None:
        """One layer computing `layers`' outputs side by side (their output rows stacked), or None when their
        inputs differ or a layer's rows are not whole packing blocks (the packing interleaves rows within a block of
        PACK_BLOCK_ROWS, so whole blocks stack as they are; tests/test_lean_llama.py checks both cases)."""
        if len({layer.in_features for layer in layers}) != 1:
            return None
        if any(layer.out_features % PACK_BLOCK_ROWS for layer in layers):
            return None
        packed = torch.cat([layer.packed for layer in layers])  # [ΣN, K/2]
        scales_zeros = torch.cat([layer.scales_zeros for layer in layers], dim=1)  # [K/32, ΣN, 2]
        return cls(packed, scales_zeros, layers[0].in_features, sum(layer.out_features for layer in layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [..., K] bf16 → [..., N] bf16
        flat = x.reshape(-1, self.in_features)  # [rows, K]
        out = torch._weight_int4pack_mm_for_cpu(flat, self.packed, GROUP, self.scales_zeros)  # [rows, N]
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int4 group {GROUP}"
