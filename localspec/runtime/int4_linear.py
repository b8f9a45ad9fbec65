"""A linear layer whose weights are 4-bit codes in groups of 32 along K, run by one of two CPU kernels:

- **q4** (q4_kernel.py, where the forward plan's kernel table gives Q4_1 to it): w = q·d + m with float16 d and m
  as the GGUF stores them;
  `packed` [N/16, K/32, 4, 16, 4] uint8 and `scales_zeros` [N/16, K/32, 2, 16] float16 (d, m); row-invariant.
  **q4f** is the same with float32 d and m per 32; **q4k** reads Q4_K's own scales (`scales_zeros`
  [N/16, K/256, 320] uint8: d, dmin per 256, sc, mn per 32) and gives q4f's bits.
- **torch** (`_weight_int4pack_mm_for_cpu`): w = (q − 8)·scale + zero; `packed` [N, K/2] uint8 in its layout and
  `scales_zeros` [K/32, N, 2] bfloat16 (its fast path wants bfloat16 activations, scales and zeros; float32
  activations take a path ~100× slower here).

The q4 kernels take bfloat16 activations as int8 per row and group of 32 (kernels/q4_matmul.c); torch's computes in
bfloat16. models/gguf_linear.py builds these from a GGUF's Q4_1 blocks; the lean forward
(lean_llama.py) fuses them. Under torch.compile the q4 kernel (a ctypes call) is a graph break per layer.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from .q4_kernel import GROUP, LANES, LAYOUT_VERSION, Q4KMatmul, Q4Matmul, pack_q4, pack_q4k

Layout = Literal["torch", "q4", "q4f", "q4k"]


COMPUTE_DTYPE = torch.bfloat16  # the kernel's fast path: bf16 activations, scales and zeros
ROW_MULTIPLE = 16  # the kernel's packing wants N (output rows) divisible by 16; other layers stay dense
PACK_BLOCK_ROWS = 64  # the CPU packing interleaves output rows in blocks of 64: packed layers stack at multiples of it
INNER_K_TILES = 1  # argument of _convert_weight_to_int4pack_for_cpu; the CPU kernel ignores it for the layout


def layout_tag(kernel: Q4Matmul | None) -> str:
    """The name of the packed layout `kernel` reads (None: torch's), with the q4 layout's version."""
    return "torch" if kernel is None else f"q4/{LAYOUT_VERSION}"


class Int4Linear(nn.Module):
    """y = x · Wᵀ with W [N, K] as 4-bit codes in groups of 32 along K, bf16 compute, on `kernel` (the q4 kernel:
    w = q·d + m) or torch's (None: w = (q − 8)·scale + zero). No bias (llama's linears have none)."""

    def __init__(
        self,
        packed: torch.Tensor,
        scales_zeros: torch.Tensor,
        in_features: int,
        out_features: int,
        kernel: Q4Matmul | None = None,  # None: torch's kernel and layout
    ):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.kernel = kernel
        self.register_buffer("packed", packed)  # the codes in the kernel's layout (module docstring)
        self.register_buffer("scales_zeros", scales_zeros)  # its scales and offsets
        self._matmul = self._on_q4 if kernel is not None else self._on_torch  # the kernel it was built for

    @property
    def layout(self) -> Layout:
        return "torch" if self.kernel is None else self.kernel.KIND

    @property
    def row_invariant(self) -> bool:
        """A row's output is the same whatever the other rows of the call (the q4 kernel's; torch's picks tiles by
        the row count)."""
        return self.kernel is not None

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
    def from_q4_1(cls, codes: torch.Tensor, d: torch.Tensor, m: torch.Tensor, kernel: Q4Matmul | None) -> Int4Linear:
        """From a GGUF Q4_1 tensor's fields (codes [N, K] in 0..15, d and m [N, K/32]: w = q·d + m), on `kernel`
        (the q4 layout, d and m kept as they are in the kernel's scale dtype: float16 for q4, float32 for q4f) or,
        with None, torch's (scale = d, zero = m + 8d in bf16)."""
        if kernel is None:
            scale = d.float()
            return cls.from_codes(
                codes.to(torch.int32), scale, m.float() + 8.0 * scale
            )  # (q − 8)·d + (m + 8d) = q·d + m
        if d.dtype.itemsize > kernel.SCALES.itemsize:
            raise ValueError(f"the {kernel.KIND} kernel reads {kernel.SCALES} scales; these are {d.dtype}")
        packed, dm = pack_q4(codes, d, m, kernel.SCALES)
        return cls(packed, dm, codes.shape[1], codes.shape[0], kernel)

    @classmethod
    def from_q4k(cls, fields, kernel: Q4KMatmul) -> Int4Linear:
        """From a GGUF Q4_K tensor's fields as stored (models/gguf_linear.Q4KFields), on the q4k kernel."""
        packed, scales = pack_q4k(fields.codes, fields.d, fields.dmin, fields.sc, fields.mn)
        return cls(packed, scales, fields.codes.shape[1], fields.codes.shape[0], kernel)

    @classmethod
    def concatenated(cls, layers: list[Int4Linear]) -> Int4Linear | None:
        """One layer computing `layers`' outputs side by side (their output rows stacked), or None when their
        inputs differ or a layer's rows are not whole packing blocks (the packing interleaves rows within a block of
        PACK_BLOCK_ROWS, so whole blocks stack as they are; tests/test_lean_llama.py checks both cases)."""
        if len({layer.in_features for layer in layers}) != 1 or len({id(layer.kernel) for layer in layers}) != 1:
            return None
        rows, kernel = sum(layer.out_features for layer in layers), layers[0].kernel
        if kernel is not None:  # q4: blocks of 16 outputs, each with its own scales, stack as they are
            packed = torch.cat([layer.packed for layer in layers])  # [ΣN/16, K/32, 4, 16, 4]
            dm = torch.cat([layer.scales_zeros for layer in layers])  # [ΣN/16, K/32, 2, 16] (q4k: [ΣN/16, K/256, 320])
            return cls(packed, dm, layers[0].in_features, rows, kernel)
        if any(layer.out_features % PACK_BLOCK_ROWS for layer in layers):
            return None
        packed = torch.cat([layer.packed for layer in layers])  # [ΣN, K/2]
        scales_zeros = torch.cat([layer.scales_zeros for layer in layers], dim=1)  # [K/32, ΣN, 2]
        return cls(packed, scales_zeros, layers[0].in_features, rows)

    def share_with(self, parts: list[Int4Linear]) -> None:
        """Rebind `parts` (the layers this one was concatenated from) to views of its storage, so the codes are
        kept once; torch's layout interleaves scales across outputs, so there each part keeps its own."""
        unit = 1 if self.kernel is None else LANES  # outputs per leading index of `packed`
        sizes = [part.out_features // unit for part in parts]
        for part, rows in zip(parts, self.packed.split(sizes), strict=True):
            part.packed = rows
        if self.kernel is not None:
            for part, rows in zip(parts, self.scales_zeros.split(sizes), strict=True):
                part.scales_zeros = rows

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [..., K] bf16 → [..., N] bf16
        return self._matmul(x)

    def _on_q4(self, x: torch.Tensor) -> torch.Tensor:
        buffers = self._buffers  # read from their dict: nn.Module's attribute fallback costs µs a call
        return self.kernel.matmul(x, buffers["packed"], buffers["scales_zeros"], self.out_features)

    def _on_torch(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)  # [rows, K]
        out = torch._weight_int4pack_mm_for_cpu(flat, self.packed, GROUP, self.scales_zeros)  # [rows, N]
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int4 group {GROUP}, {self.layout}"
