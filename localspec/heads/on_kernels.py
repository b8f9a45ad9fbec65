"""A head on the kernels' library: each module's decoder layer in one layer-kernel call (runtime/layer_kernel.py)
and the draft vocabulary's LM rows on the q8 matmul, their weights quantized once to Q8_0 blocks (8.5 bits a
weight, per 32: d = max |w| / 127, q = rint(w / d)). A drafted token then costs a handful of torch ops and two C
calls instead of ~40 torch ops: on the embedded pair's head about a quarter of the time (docs/performance.md).

The drafts' numbers change by the Q8_0 rounding and the kernel's bfloat16 steps, so a draft may differ from the
torch head's; the answer never does (the target verifies every draft). A token tree's depths run on the kernel too:
each depth's call recomputes the rows of the nodes expanded before it (their ancestors among them) after the
verified positions alone, under the tree's mask among the call's rows, since the kernel's mask covers the rows of
its call and nothing of the cache; a row is a function of what it sees, so the recomputed rows are the earlier ones
bitwise.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from localspec.runtime.layer_kernel import BoundLayer, LayerKernel, LayerWeights, LinearPart
from localspec.runtime.q4_kernel import GROUP, Q8Matmul, pack_q8

from .layers import HeadModule, KVCache, rope_cos_sin


def q8_blocks(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, K] weights → (codes [N, K] int8, d [N, K/32] float16): GGUF Q8_0, w ≈ q·d."""
    n, k = weight.shape
    groups = weight.detach().float().reshape(n, k // GROUP, GROUP)
    d = (groups.abs().amax(dim=-1) / 127.0).half()  # [N, K/32]
    scale = d.float().unsqueeze(-1)
    codes = torch.where(scale > 0, groups / scale.clamp_min(torch.finfo(torch.float32).tiny), 0.0)
    return codes.round().clamp(-127, 127).to(torch.int8).reshape(n, k), d


def q8_part(*linears: torch.nn.Linear) -> tuple[LinearPart]:
    """Linears over the same input as one q8 LinearPart, their outputs side by side."""
    weight = torch.cat([linear.weight.detach() for linear in linears])
    codes, d = q8_blocks(weight)
    return (LinearPart("q8", weight.shape[0], *pack_q8(codes, d)),)


def fits(module: HeadModule, dtype: torch.dtype) -> bool:
    """Whether a module's layer runs on the kernel: an EAGLE / MTP layer (eagle3's attention input is twice the
    hidden size, which the kernel does not take) in bfloat16, with shapes the q8 kernel packs."""
    shapes = [module.q_proj, module.k_proj, module.v_proj, module.o_proj, module.gate_proj, module.down_proj]
    packs = all(m.weight.shape[0] % 16 == 0 and m.weight.shape[1] % GROUP == 0 for m in shapes)
    return module.kind != "eagle3" and dtype == torch.bfloat16 and packs


@dataclass(frozen=True)
class KernelModule:
    """One module's decoder layer bound to the layer kernel; run() is HeadModule's layer after its fusion."""

    bound: BoundLayer
    head_dim: int
    theta: float

    @classmethod
    def of(cls, module: HeadModule, kernel: LayerKernel, eps: float, theta: float) -> KernelModule:
        heads, kv_heads, dim = module.heads, module.kv_heads, module.head_dim
        weights = LayerWeights(
            module.input_layernorm.weight.detach().to(torch.bfloat16).contiguous(),
            module.post_attention_layernorm.weight.detach().to(torch.bfloat16).contiguous(),
            q8_part(module.q_proj, module.k_proj, module.v_proj),
            q8_part(module.o_proj),
            q8_part(module.gate_proj, module.up_proj),
            q8_part(module.down_proj),
            eps,
            eps,
            dim**-0.5,
            heads,
            kv_heads,
            dim,
            module.gate_proj.out_features,
        )
        return cls(kernel.bind(weights), dim, theta)

    def run(
        self, x: torch.Tensor, positions: torch.Tensor, cache: KVCache, visible: torch.Tensor | None = None
    ) -> torch.Tensor:
        """x [T, H] bf16 (the fused input, before the input norm), positions [T] → the layer's output [T, H];
        appends the T rows' keys and values to the cache. Each row sees the cache and the rows before it, or those
        `visible` [T, T] bool marks (a tree's ancestors and itself)."""
        cos, sin = rope_cos_sin(positions, self.head_dim, self.theta)  # [T, D] float32
        half = self.head_dim // 2
        sin = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)  # rotate_half's sign folded in, as the kernel reads
        cos, sin = cos.to(torch.bfloat16)[None, None], sin.to(torch.bfloat16)[None, None]  # [1, 1, T, D]
        if visible is not None:
            visible = visible.to(torch.uint8).contiguous()  # as the kernel reads it
        return self.bound.run(x[None].contiguous(), cos.contiguous(), sin.contiguous(), cache, visible)[0]


@dataclass(frozen=True)
class DraftLM:
    """The draft vocabulary's LM rows as Q8_0 blocks on the q8 matmul: logits in float32."""

    matmul: Q8Matmul
    codes: torch.Tensor
    scales: torch.Tensor
    rows: int

    @classmethod
    def of(cls, weight: torch.Tensor, matmul: Q8Matmul) -> DraftLM | None:
        rows, k = weight.shape
        if rows % 16 or k % GROUP:
            return None
        return cls(matmul, *pack_q8(*q8_blocks(weight)), rows)

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:  # [..., H] bf16 → [..., Vd] float32
        return self.matmul.matmul(hidden.to(torch.bfloat16), self.codes, self.scales, self.rows)
