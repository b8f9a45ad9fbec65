"""Q8_0-layout matmuls run as the file stores them: the LM head of a GGUF whose token embedding (tied to the LM head)
is Q8_0 (`Q8Head`), and a decoder layer's Q8_0 or Q5_0 linear (`Q8Linear`).

SmolLM2's 49,152 × 576 LM head is the largest matmul of a step: 57 MB as the dense bfloat16 weight the model loads,
30 MB as the file's Q8_0 blocks (32 int8 codes and a float16 scale d each: w = q·d). `Q8Head` runs the q8 matmul of
the q4 kernel's library (kernels/q8_matmul.c) on those blocks: the file's exact weights (the dense copy rounds q·d
to bfloat16), float32 logits, and a row's logits the same whatever the other rows of the call (one thread sums an
output in one order). On a CPU where oneDNN cannot prepack bf16 (AVX2 only) the dense head re-packs its 57 MB in
every call, so there this is the difference between most of a step and a small part of it.

The loader records the Q8Head with the model (plan.record_load) and the forward plan makes it the runner's LM head.
The token embedding it is tied to is then `HeadRowsEmbedding`: each looked-up row dequantized from the head's own
packed codes and scales, so the model holds no dense [vocab, hidden] copy of it. Whatever reads the embedding's or the
head's `weight` (a head proposer, a draft that borrows the target's embedding, transformers' own forward) gets the
dense copy, made once on first use and kept.

`Q8Linear` is the same matmul as a decoder linear: int8 codes with a float16 scale per 32 weights (Q8_0: w = q·d;
Q5_0: w = d·(q − 16), whose q − 16 in −16..15 is an int8 code), or on the q8k matmul with a float32 scale and offset
per 16 (Q6_K, Q5_K, Q5_1: `from_q8k`; `scales` then holds d and m), float32 sums rounded to the bfloat16 the layers
compute in (an elementwise rounding: a row still does not depend on the other rows). The layer kernel reads its codes
and scales in place (layer_kernel.LinearPart) and rounds its sums the same way.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from .q4_kernel import Q6KMatmul, Q8KMatmul, Q8Matmul, pack_q6k, pack_q8, pack_q8k, six_codes


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
        kind, group = self.kernel.KIND, self.in_features // self.codes.shape[1]
        codes = f"6-bit codes in planes, group {group}" if kind == "q6k" else f"int8 codes group {group}"
        return f"in_features={self.in_features}, out_features={self.out_features}, {codes}, {kind}"


ROWS_CHUNK = 4096  # rows dequantized at a time where the whole dense copy is made


class HeadRowsEmbedding(nn.Module):
    """The token embedding a Q8Head on the q8 or q6k kernel is tied to, read from the head's packed blocks: a row is
    computed exactly as the dense copy's (gguf_linear.dequantize's float32 steps, then one rounding to `dtype`), so
    every lookup is bitwise the dense embedding's. `weight` makes that dense copy (and keeps it: lookups then read
    it) for the code that wants the matrix itself."""

    def __init__(self, head: Q8Head, dtype: torch.dtype) -> None:
        super().__init__()
        if head.kernel.KIND not in ("q8", "q6k"):
            raise ValueError(f"rows are read from a q8 or q6k head, not {head.kernel.KIND}")
        self.__dict__["head"] = head  # not a submodule: the load record holds it, the plan runs it
        self.num_embeddings, self.embedding_dim, self.dtype = head.out_features, head.in_features, dtype
        self.dense: torch.Tensor | None = None

    @property
    def device(self) -> torch.device:
        return self.head.codes.device

    @property
    def weight(self) -> torch.Tensor:
        """The dense [vocab, hidden] embedding, made on first use ROWS_CHUNK rows at a time."""
        if self.dense is None:
            out = torch.empty(self.num_embeddings, self.embedding_dim, dtype=self.dtype, device=self.device)
            for start in range(0, self.num_embeddings, ROWS_CHUNK):
                ids = torch.arange(start, min(start + ROWS_CHUNK, self.num_embeddings), device=self.device)
                out[start : start + ids.numel()] = self.rows(ids)
            self.dense = out
        return self.dense

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` [n] → [n, hidden] in `dtype`, from the packed codes (block ids // 16, lane ids % 16)."""
        codes, scales = self.head.codes, self.head.scales
        block, lane = ids // codes.shape[3], ids % codes.shape[3]
        n, count = ids.numel(), torch.arange(ids.numel(), device=ids.device)
        picked = codes[block, :, :, lane, :]  # [n, K/g, g/4, 4]: code k = g·group + 4·quad + byte (q6k: its planes)
        if self.head.kernel.KIND == "q8":  # w = q·d (Q8_0), d per 32
            d = scales[block, :, lane]  # [n, K/32] float16
            values = picked.reshape(n, d.shape[1], -1).float() * d.float()[..., None]
        else:  # q6k: w = q·(d·sc) + 0 (q8k_fields' d·sc and zero m), d per 256, sc per 16
            packed = scales[block]  # [n, K/256, 288]: d as [16 lanes] float16, then sc as [16 groups][16 lanes] int8
            d = packed[..., :32].contiguous().view(torch.float16)[count, :, lane]  # [n, K/256]
            sc = packed[..., 32:].contiguous().view(torch.int8).reshape(n, -1, 16, 16)[count, :, :, lane]
            scale = (d.float()[..., None] * sc.float()).reshape(n, -1)  # [n, K/16]
            zero = torch.zeros_like(scale)[..., None]  # dequantize's + m: −0 becomes +0 as in the dense copy
            values = six_codes(picked).reshape(n, scale.shape[1], -1).float() * scale[..., None] + zero
        return values.reshape(n, -1).to(self.dtype)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.dense is not None:
            return F.embedding(input_ids, self.dense)
        return self.rows(input_ids.reshape(-1)).reshape(*input_ids.shape, self.embedding_dim)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, rows from the {self.head.kernel.KIND} head's blocks"


class TiedHead(nn.Module):
    """An LM head tied to a HeadRowsEmbedding: `weight` is the embedding's (made when first read), the forward its
    dense matmul. The runner computes logits on the Q8Head instead; this serves transformers' own forward."""

    def __init__(self, embedding: HeadRowsEmbedding) -> None:
        super().__init__()
        self.__dict__["embedding"] = embedding  # not a submodule: the model's embed_tokens
        self.in_features, self.out_features = embedding.embedding_dim, embedding.num_embeddings

    @property
    def weight(self) -> torch.Tensor:
        return self.embedding.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


def embedding_format(model: nn.Module) -> tuple[torch.dtype, torch.device]:
    """(dtype, device) of a model's token embedding, without making a HeadRowsEmbedding's dense copy."""
    embedding = model.get_input_embeddings()
    if isinstance(embedding, HeadRowsEmbedding):
        return embedding.dtype, embedding.device
    return embedding.weight.dtype, embedding.weight.device


def output_rows(model: nn.Module) -> int:
    """A model's LM head's output rows (its vocabulary), without making a TiedHead's dense weight."""
    head = model.get_output_embeddings()
    return head.out_features if isinstance(head, TiedHead) else head.weight.shape[0]
