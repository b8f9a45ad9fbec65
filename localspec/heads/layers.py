"""The pieces of a head: RMSNorm, rotary embedding, a Llama-style decoder layer split into stages (fuse → qkv →
attention → finish) so inference (with a KV cache) and training (with the training-time-test mask) share them."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from localspec.runtime.packed_linear import PackedLinear
from localspec.runtime.plan import packing

PACKING = packing()  # the plan's choice for the head's bf16 linears, read once


def linear(layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """layer(x); under inference mode through its oneDNN-prepacked copy (runtime/packed_linear.py: bitwise the same
    output, about half the time for the head's bf16 shapes on a CPU). Training keeps the plain layer, which autograd
    runs through."""
    packed = torch.is_inference_mode_enabled() and PACKING.value == "packed"
    return (PackedLinear.of(layer) if packed else layer)(x)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.eps))


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [..., T] → cos, sin [..., T, head_dim] (the rotate-half layout Llama uses)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim))
    angles = positions.to(torch.float32)[..., None] * inv_freq  # [..., T, head_dim/2]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [..., heads, T, head_dim]; cos/sin [..., T, head_dim] broadcast over heads. The result keeps x's dtype
    (the head runs in its own dtype: bf16 under a bf16 target)."""
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos.unsqueeze(-3) + rotated * sin.unsqueeze(-3)


class HeadModule(nn.Module):
    """One fusion + decoder layer.

    eagle / mtp: x = eh_proj([enorm(embedding) ; hnorm(previous hidden)]), attention input = input_layernorm(x),
                 residual x.
    eagle3:      x = fc_norm(fc_proj([anchor ; previous hidden])), attention input = [input_norm(embedding) ; x]
                 (2 × hidden wide), residual x. anchor = the last target hidden of the chain (on the first step the
                 previous hidden is that same target hidden: it is duplicated).
    """

    def __init__(
        self, kind: str, hidden: int, heads: int, kv_heads: int, head_dim: int, intermediate: int, eps: float
    ) -> None:
        super().__init__()
        self.kind, self.heads, self.kv_heads, self.head_dim = kind, heads, kv_heads, head_dim
        if kind == "eagle3":
            self.fc_proj = nn.Linear(2 * hidden, hidden, bias=False)
            self.fc_norm = RMSNorm(hidden, eps)
            self.input_norm = RMSNorm(hidden, eps)
            attn_in = 2 * hidden
        else:
            self.enorm = RMSNorm(hidden, eps)
            self.hnorm = RMSNorm(hidden, eps)
            self.eh_proj = nn.Linear(2 * hidden, hidden, bias=False)
            self.input_layernorm = RMSNorm(hidden, eps)
            attn_in = hidden
        self.q_proj = nn.Linear(attn_in, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(attn_in, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(attn_in, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def fuse(
        self, prev_hidden: torch.Tensor, embedding: torch.Tensor, anchor: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """[..., T, H] each → (attention input [..., T, A], residual [..., T, H])."""
        if self.kind == "eagle3":
            x = self.fc_norm(linear(self.fc_proj, torch.cat([anchor, prev_hidden], dim=-1)))
            return torch.cat([self.input_norm(embedding), x], dim=-1), x
        x = self.fused(prev_hidden, embedding)
        return self.input_layernorm(x), x

    def fused(self, prev_hidden: torch.Tensor, embedding: torch.Tensor) -> torch.Tensor:
        """eagle / mtp: [..., T, H] each → x [..., T, H], the residual the decoder layer starts from."""
        return linear(self.eh_proj, torch.cat([self.enorm(embedding), self.hnorm(prev_hidden)], dim=-1))

    def qkv(self, attn_input: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """attn_input [B, T, A] → q [B, heads, T, d], k, v [B, kv_heads, T, d] (rotary applied to q and k)."""
        b, t, _ = attn_input.shape
        q = linear(self.q_proj, attn_input).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = linear(self.k_proj, attn_input).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = linear(self.v_proj, attn_input).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def finish(self, attn_out: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """attn_out [B, heads, T, d] → layer output [B, T, H]."""
        b, _, t, _ = attn_out.shape
        x = residual + linear(self.o_proj, attn_out.transpose(1, 2).reshape(b, t, -1))
        h = self.post_attention_layernorm(x)
        return x + linear(self.down_proj, F.silu(linear(self.gate_proj, h)) * linear(self.up_proj, h))

    def init_from_target_layer(self, layer: nn.Module) -> None:
        """Copy a target decoder layer's weights where the shapes match (attention and MLP; eagle3's wider q/k/v
        get the target's weights on the hidden half)."""
        with torch.no_grad():
            for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
                src = getattr(layer.self_attn, name).weight
                dst = getattr(self, name).weight
                if dst.shape == src.shape:
                    dst.copy_(src)
                elif dst.shape[1] == 2 * src.shape[1]:
                    dst.zero_()
                    dst[:, src.shape[1] :].copy_(src)
            for name in ("gate_proj", "up_proj", "down_proj"):
                getattr(self, name).weight.copy_(getattr(layer.mlp, name).weight)
            self.post_attention_layernorm.weight.copy_(layer.post_attention_layernorm.weight)
            if self.kind == "eagle3":
                hidden = self.fc_proj.weight.shape[0]
                self.fc_proj.weight.zero_()
                self.fc_proj.weight[:, hidden:].copy_(torch.eye(hidden))
                self.fc_norm.weight.copy_(layer.input_layernorm.weight)
            else:
                hidden = self.eh_proj.weight.shape[0]
                self.eh_proj.weight.normal_(0.0, 0.02)
                self.eh_proj.weight[:, hidden:].add_(torch.eye(hidden))
                self.input_layernorm.weight.copy_(layer.input_layernorm.weight)


class KVCache:
    """One module's keys and values for positions 1..length (index i holds position i + 1). Grows by doubling;
    crop() is the rollback."""

    def __init__(self, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device) -> None:
        self.keys = torch.zeros((1, kv_heads, 64, head_dim), dtype=dtype, device=device)  # [1, kv, capacity, d]
        self.values = torch.zeros_like(self.keys)  # [1, kv, capacity, d]
        self.length = 0

    def _room(self, new: int) -> None:
        if self.length + new > self.keys.shape[2]:
            capacity = max(2 * self.keys.shape[2], self.length + new)
            grown_k = self.keys.new_zeros((*self.keys.shape[:2], capacity, self.keys.shape[3]))
            grown_v = torch.zeros_like(grown_k)
            grown_k[:, :, : self.length] = self.keys[:, :, : self.length]
            grown_v[:, :, : self.length] = self.values[:, :, : self.length]
            self.keys, self.values = grown_k, grown_v

    def append_in_place(self, rows: int, template: torch.Tensor) -> int:
        """Room for `rows` more positions, which the caller writes into keys and values (the layer kernel does);
        returns where they start."""
        self._room(rows)
        start = self.length
        self.length += rows
        return start

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        new = keys.shape[2]
        self._room(new)
        self.keys[:, :, self.length : self.length + new] = keys
        self.values[:, :, self.length : self.length + new] = values
        self.length += new
        return self.keys[:, :, : self.length], self.values[:, :, : self.length]

    def crop(self, length: int) -> None:
        self.length = min(self.length, max(length, 0))
