"""A feature-level head: reads the target's last hidden state and the next token's embedding, predicts the next
hidden state, scores it with the target's (frozen) embedding matrix over a reduced draft vocabulary.

Positions: the head's entry at position p reads (hidden at p - 1, token at p) and predicts the hidden at p, whose
argmax is the token at p + 1. Real entries (target hidden) live in each module's KV cache; draft-chain entries are
appended while proposing and cropped right after.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import HeadConfig
from .layers import HeadModule, KVCache, RMSNorm, rope_cos_sin


class FeatureHead(nn.Module):
    def __init__(self, config: HeadConfig, embedding: torch.Tensor) -> None:
        """embedding: the target's input embedding [V, H] (frozen, not saved); the LM head is tied to it when the
        target ties them, else pass lm_weight via set_lm_weight."""
        super().__init__()
        self.config = config.validate()
        c = config
        self.layers = nn.ModuleList(HeadModule(c.kind, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim,
                                               c.intermediate_size, c.rms_eps) for _ in range(c.num_modules))
        self.norms = nn.ModuleList(RMSNorm(c.hidden_size, c.rms_eps) for _ in range(c.num_modules))
        self.register_buffer("draft_token_ids", torch.arange(c.draft_vocab_size), persistent=True)  # [Vd] int64
        self.embedding = embedding.detach()  # [V, H], frozen, not a parameter
        self.lm_weight = embedding.detach()  # [V, H]
        self._draft_lm_weight = None

    def set_lm_weight(self, weight: torch.Tensor) -> None:
        self.lm_weight = weight.detach()
        self._draft_lm_weight = None

    def set_draft_vocab(self, token_ids: torch.Tensor) -> None:
        self.draft_token_ids = token_ids.to(torch.long).to(self.draft_token_ids.device)
        self._draft_lm_weight = None

    @property
    def draft_lm_weight(self) -> torch.Tensor:
        """[Vd, H] rows of the target's LM head for the draft vocabulary (gathered once)."""
        if self._draft_lm_weight is None or self._draft_lm_weight.shape[0] != self.draft_token_ids.shape[0]:
            self._draft_lm_weight = self.lm_weight[self.draft_token_ids].contiguous()
        return self._draft_lm_weight

    def rope(self, positions: torch.Tensor):
        return rope_cos_sin(positions, self.config.head_dim, self.config.rope_theta)

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., H] → [..., Vd] logits over the draft vocabulary."""
        return hidden @ self.draft_lm_weight.T

    # ---- inference: one module, its cache, some new positions ----------------------------------------------
    def run_module(self, module_index: int, cache: KVCache, prev_hidden: torch.Tensor, token_ids: torch.Tensor,
                   positions: torch.Tensor, anchor: torch.Tensor) -> torch.Tensor:
        """prev_hidden, anchor [T, H]; token_ids, positions [T] → the head's hidden [T, H] (after its norm).
        Appends T entries to the cache; the queries see the cache and themselves causally."""
        layer = self.layers[module_index]
        embedding = self.embedding[token_ids]  # [T, H]
        attn_input, residual = layer.fuse(prev_hidden[None], embedding[None], anchor[None])
        cos, sin = self.rope(positions)
        q, k, v = layer.qkv(attn_input, cos, sin)
        keys, values = cache.append(k, v)
        t, total = q.shape[2], keys.shape[2]
        mask = None
        if t > 1:
            mask = torch.ones((t, total), dtype=torch.bool, device=q.device).tril(total - t)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)
        return self.norms[module_index](layer.finish(out, residual))[0]

    def new_caches(self) -> list[KVCache]:
        p = next(self.parameters())
        return [KVCache(self.config.num_kv_heads, self.config.head_dim, p.dtype, p.device)
                for _ in range(self.config.num_modules)]
