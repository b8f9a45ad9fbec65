"""A feature-level head: reads the target's features (its last hidden state, optionally with the outputs of earlier
layers, projected down to one hidden state) and the next token's embedding, predicts the next hidden state, scores
it with the target's (frozen) embedding matrix over a reduced draft vocabulary.

Positions: the head's entry at position p reads (hidden at p - 1, token at p) and predicts the hidden at p, whose
argmax is the token at p + 1. Real entries (target hidden) live in each module's KV cache; draft-chain entries are
appended while proposing and cropped right after.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from localspec.runtime.q4_kernel import Q8Matmul

from .config import HeadConfig
from .layers import HeadModule, KVCache, RMSNorm, linear, rope_cos_sin
from .on_kernels import DraftLM, KernelModule, fits


class FeatureHead(nn.Module):
    def __init__(self, config: HeadConfig, embedding: torch.Tensor) -> None:
        """embedding: the target's input embedding [V, H] (frozen, not saved); the LM head is tied to it when the
        target ties them, else pass lm_weight via set_lm_weight."""
        super().__init__()
        self.config = config.validate()
        c = config
        self.layers = nn.ModuleList(
            HeadModule(c.kind, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size, c.rms_eps)
            for _ in range(c.num_modules)
        )
        self.norms = nn.ModuleList(RMSNorm(c.hidden_size, c.rms_eps) for _ in range(c.num_modules))
        # multi-layer features: each earlier layer's output normed (mid-stack residuals are ~10-100x the last
        # hidden's scale here), then [normed ; last hidden] projected to hidden
        self.feature_norms = nn.ModuleList(RMSNorm(c.hidden_size, c.rms_eps) for _ in c.feature_layers)
        self.feature_proj = nn.Linear(c.feature_size, c.hidden_size, bias=False) if c.feature_layers else None
        self.register_buffer("draft_token_ids", torch.arange(c.draft_vocab_size), persistent=True)  # [Vd] int64
        self.embedding = embedding.detach()  # [V, H], frozen, not a parameter
        self.lm_weight = embedding.detach()  # [V, H]
        self._draft_lm_weight = None
        self._draft_lm = ()  # (draft_lm_weight, an nn.Linear over it) once built: a tuple, so not a submodule
        # on the kernels' library (on_kernels.py, use_kernels): each module's layer (None: on the torch ops), the q8
        # matmul, and (draft_lm_weight, its Q8_0 blocks) once built
        self._kernel_layers: tuple = ()
        self._q8: Q8Matmul | None = None
        self._draft_q8: tuple = ()

    def _apply(self, fn, recurse: bool = True):
        """.float(), .to(device) and the like reach the frozen target matrices too: they are not parameters."""
        super()._apply(fn, recurse)
        self.embedding, self.lm_weight = fn(self.embedding), fn(self.lm_weight)
        self._draft_lm_weight, self._draft_lm = None, ()
        self._kernel_layers, self._q8, self._draft_q8 = (), None, ()  # the weights they copied may have changed
        return self

    def use_kernels(self, layer_kernel, q8: Q8Matmul) -> int:
        """Run inference on the kernels' library (on_kernels.py): each module whose layer fits the layer kernel,
        and the draft vocabulary's LM rows on the q8 matmul. Returns how many modules run on the kernel."""
        dtype, c = next(self.parameters()).dtype, self.config
        self._kernel_layers = tuple(
            KernelModule.of(module, layer_kernel, c.rms_eps, c.rope_theta) if fits(module, dtype) else None
            for module in self.layers
        )
        self._q8, self._draft_q8 = q8, ()
        return sum(layer is not None for layer in self._kernel_layers)

    def set_lm_weight(self, weight: torch.Tensor) -> None:
        self.lm_weight = weight.detach()
        self._draft_lm_weight, self._draft_lm, self._draft_q8 = None, (), ()

    def set_draft_vocab(self, token_ids: torch.Tensor) -> None:
        self.draft_token_ids = token_ids.to(torch.long).to(self.draft_token_ids.device)
        self._draft_lm_weight, self._draft_lm, self._draft_q8 = None, (), ()

    @property
    def draft_lm_weight(self) -> torch.Tensor:
        """[Vd, H] rows of the target's LM head for the draft vocabulary (gathered once)."""
        if self._draft_lm_weight is None or self._draft_lm_weight.shape[0] != self.draft_token_ids.shape[0]:
            with torch.inference_mode(False):  # a normal tensor even when first asked for while proposing
                self._draft_lm_weight = self.lm_weight[self.draft_token_ids].contiguous()
        return self._draft_lm_weight

    def project_features(self, features: torch.Tensor) -> torch.Tensor:
        """[..., F] target features → [..., H], the hidden state the head's modules read (identity without
        feature layers)."""
        if self.feature_proj is None:
            return features
        parts = features.split(self.config.hidden_size, dim=-1)
        normed = [norm(part) for norm, part in zip(self.feature_norms, parts[:-1])]
        return linear(self.feature_proj, torch.cat(normed + [parts[-1]], dim=-1))

    def init_feature_proj(self) -> None:
        """Start the projection as 'read the last hidden only' (zeros on the earlier layers' columns), so a head
        trained on the last hidden continues from where it was."""
        if self.feature_proj is None:
            return
        hidden = self.config.hidden_size
        with torch.no_grad():
            self.feature_proj.weight.zero_()
            self.feature_proj.weight[:, -hidden:].copy_(torch.eye(hidden))

    def rope(self, positions: torch.Tensor):
        return rope_cos_sin(positions, self.config.head_dim, self.config.rope_theta)

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., H] → [..., Vd] logits over the draft vocabulary (under inference mode as a prepacked linear)."""
        if not torch.is_inference_mode_enabled():
            return hidden @ self.draft_lm_weight.T
        weight = self.draft_lm_weight
        if self._q8 is not None and hidden.device.type == "cpu":  # float32 logits from its Q8_0 blocks
            if not self._draft_q8 or self._draft_q8[0] is not weight:
                self._draft_q8 = (weight, DraftLM.of(weight, self._q8))
            if self._draft_q8[1] is not None:
                return self._draft_q8[1](hidden)
        if not self._draft_lm or self._draft_lm[0] is not weight:
            layer = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")
            layer.weight = nn.Parameter(weight, requires_grad=False)
            self._draft_lm = (weight, layer)
        return linear(self._draft_lm[1], hidden)

    # ---- inference: one module, its cache, some new positions ----------------------------------------------
    def run_module(
        self,
        module_index: int,
        cache: KVCache,
        prev_hidden: torch.Tensor,
        token_ids: torch.Tensor,
        positions: torch.Tensor,
        anchor: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """prev_hidden, anchor [T, H]; token_ids, positions [T] → the head's hidden [T, H] (after its norm).
        Appends T entries to the cache; the queries see the cache and themselves causally, or what `mask`
        ([T, cache length + T] bool, True = visible: a token tree's rows) allows."""
        if mask is None and self.on_kernel(module_index):
            return self.run_rows(module_index, cache, prev_hidden, token_ids, positions)
        layer = self.layers[module_index]
        embedding = self.embedding[token_ids]  # [T, H]
        attn_input, residual = layer.fuse(prev_hidden[None], embedding[None], anchor[None])
        cos, sin = self.rope(positions)
        q, k, v = layer.qkv(attn_input, cos, sin)
        keys, values = cache.append(k, v)
        t, total = q.shape[2], keys.shape[2]
        if mask is None and t > 1:
            mask = torch.ones((t, total), dtype=torch.bool, device=q.device).tril(total - t)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)
        return self.norms[module_index](layer.finish(out, residual))[0]

    def on_kernel(self, module_index: int) -> bool:
        """Whether this module's inference runs on the layer kernel (use_kernels)."""
        layers = self._kernel_layers
        return bool(layers) and layers[module_index] is not None and torch.is_inference_mode_enabled()

    def run_rows(self, module_index: int, cache: KVCache, *rows: torch.Tensor, visible=None) -> torch.Tensor:
        """run_module on the layer kernel (on_kernel) for rows (prev_hidden [T, H], token_ids [T], positions [T])
        that see the whole cache and, among themselves, the rows before them or what `visible` [T, T] bool marks
        → [T, H]. Appends T entries."""
        prev_hidden, token_ids, positions = rows
        x = self.layers[module_index].fused(prev_hidden, self.embedding[token_ids])  # [T, H]
        return self.norms[module_index](self._kernel_layers[module_index].run(x, positions, cache, visible))

    def new_caches(self) -> list[KVCache]:
        p = next(self.parameters())
        return [
            KVCache(self.config.num_kv_heads, self.config.head_dim, p.dtype, p.device)
            for _ in range(self.config.num_modules)
        ]


def with_feature_layers(head: FeatureHead, feature_layers: tuple[int, ...]) -> FeatureHead:
    """The same head reading more of the target's layers (a superset of those it reads): every trained weight is
    kept, including the projection's columns and norms for the layers it already read; the new layers' columns start
    at zero, so it predicts exactly what `head` did until training moves it."""
    old_layers = head.config.feature_layers
    if not set(old_layers) <= set(feature_layers):
        raise ValueError(
            f"a head reading layers {list(old_layers)} can only be widened to a superset of them "
            f"(got {list(feature_layers)})"
        )
    config = replace(head.config, feature_layers=tuple(feature_layers)).validate()
    widened = FeatureHead(config, head.embedding)
    widened.set_lm_weight(head.lm_weight)
    widened.set_draft_vocab(head.draft_token_ids)
    kept = {name: value for name, value in head.state_dict().items() if not name.startswith("feature_")}
    missing, _ = widened.load_state_dict(kept, strict=False)
    assert all(name.startswith("feature_") for name in missing), missing
    widened.init_feature_proj()
    if old_layers:
        hidden = config.hidden_size
        with torch.no_grad():
            for old_index, layer in enumerate(old_layers):
                new_index = config.feature_layers.index(layer)
                widened.feature_norms[new_index].load_state_dict(head.feature_norms[old_index].state_dict())
                widened.feature_proj.weight[:, new_index * hidden : (new_index + 1) * hidden].copy_(
                    head.feature_proj.weight[:, old_index * hidden : (old_index + 1) * hidden]
                )
            widened.feature_proj.weight[:, -hidden:].copy_(head.feature_proj.weight[:, -hidden:])
    parameter = next(head.parameters())
    return widened.to(device=parameter.device, dtype=parameter.dtype).train(head.training)
