"""A causal LM with its own KV cache: extend by some tokens, crop back to a length. Used for target and draft."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Literal

import torch

from .compiled import CompileMode, bucket, compile_backbone, compile_mode_from_env
from .features import backbone_features
from .static_cache import PreallocatedCache, cache_supported
from .tree import TokenTree, tree_attention_mask, tree_positions

CacheKind = Literal["static", "dynamic"]


@dataclass(frozen=True)
class ForwardOutput:
    logits: torch.Tensor | None  # [T', V] float, next-token logits at the last T' new positions (see logits_to_keep)
    hidden: torch.Tensor | None  # [T, F] features when asked for: the last hidden state (after the final norm), after
    #                              the outputs of `feature_layers` when some are named (F = H without; see features.py)


class ModelRunner:
    """Wraps a transformers causal LM and its KV cache. Knows only token ids.

    tokens holds exactly the ids whose keys/values are in the cache, so a caller can find the common prefix
    with a new context and crop to it (transformers' candidate generators roll back the same way).

    cache "static": a preallocated cache (static_cache.py) where a crop is a length reset and no step
    concatenates, kept across answers; used for every model whose layers are all full attention. "dynamic":
    transformers' DynamicCache (the fallback for sliding-window and other layer kinds).
    """

    def __init__(self, model: torch.nn.Module, cache: CacheKind = "static", compile: CompileMode | None = None) -> None:
        self.model = model.eval()
        self.device = next(model.parameters()).device
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self.max_context = int(getattr(model.config, "max_position_embeddings", 4096) or 4096)
        self._backbone = model.base_model
        self._lm_head = model.get_output_embeddings()
        self.cache = None
        self.cache_kind: CacheKind = cache if cache == "dynamic" or cache_supported(model.config) else "dynamic"
        self.tokens: list[int] = []
        self.compile_mode: CompileMode = compile_mode_from_env() if compile is None else compile
        self._compiled = None if self.compile_mode == "off" else compile_backbone(self._backbone, self.compile_mode)
        # transformers ≥ 5.2x names the argument `cache` (past_key_values is deprecated); older models keep the old name
        params = inspect.signature(self._backbone.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"

    @torch.inference_mode()  # a StaticCache's buffers are inference tensors: reset and crop update them in place
    def reset(self) -> None:
        from transformers import DynamicCache

        if self.cache_kind == "dynamic":
            self.cache = DynamicCache(config=self.model.config)
        elif self.compile_mode == "reduce-overhead":  # CUDA graphs: fixed shapes, so the whole-capacity StaticCache
            from transformers import StaticCache

            if self.cache is None:
                self.cache = StaticCache(config=self.model.config, max_cache_len=self.max_context)
            self.cache.reset()
        elif self.cache is None:
            self.cache = PreallocatedCache(self.model.config, self.max_context)
        else:
            self.cache.reset()  # keeps the buffers
        self.tokens = []

    @torch.inference_mode()
    def extend(
        self,
        token_ids: list[int],
        want_hidden: bool = False,
        logits_to_keep: int | None = None,
        feature_layers: tuple[int, ...] = (),
    ) -> ForwardOutput:
        """Run the new tokens through the model on top of the cache; return logits for the new positions: all of
        them (None), the last `logits_to_keep`, or none (0: a prefill whose logits nobody reads skips the LM head,
        a 49k x 576 matmul per prompt token on SmolLM2). want_hidden: also return the features (the last hidden
        state, after the outputs of `feature_layers`)."""
        if self.cache is None:
            self.reset()
        if isinstance(self.cache, PreallocatedCache):
            self.cache.ensure_capacity(len(self.tokens) + len(token_ids))
        rows, backbone, pad = len(token_ids), self._backbone, 0
        padded = bucket(rows) if self._compiled is not None and self.tokens else None
        if (
            padded is not None and len(self.tokens) + padded <= self.max_context
        ):  # a verify-sized forward: the compiled graph of its row bucket
            backbone, pad = self._compiled, padded - rows
        input_ids = torch.tensor([token_ids + token_ids[-1:] * pad], dtype=torch.long, device=self.device)
        out, features = backbone_features(
            backbone,
            feature_layers if want_hidden else (),
            input_ids=input_ids,
            use_cache=True,
            **{self._cache_kwarg: self.cache},
        )
        if pad:
            self.cache.crop(-pad)  # the padding rows' positions
        hidden = out.last_hidden_state[0, :rows]  # [T, H]
        features = features[:, :rows]
        if logits_to_keep is None:
            logits = self._lm_head(hidden)  # [T, V]
        elif logits_to_keep > 0:
            logits = self._lm_head(hidden[-logits_to_keep:])  # [logits_to_keep, V]
        else:
            logits = None
        self.tokens.extend(token_ids)
        return ForwardOutput(logits=logits, hidden=features[0] if want_hidden else None)

    @property
    def supports_tree(self) -> bool:
        """Token trees need the preallocated cache (keep_path moves its rows in place); a dynamic cache (sliding
        window and other layer kinds) and the CUDA-graph StaticCache verify chains only."""
        return self.cache_kind == "static" and self.compile_mode != "reduce-overhead"

    @torch.inference_mode()
    def extend_tree(
        self, pending: int, tree: TokenTree, want_hidden: bool = False, feature_layers: tuple[int, ...] = ()
    ) -> ForwardOutput:
        """One forward of the pending token and the tree's N nodes on top of the cache, under the tree attention
        mask and tree positions (eager: the compiled graphs are built for causal chains). Returns logits [N+1, V]
        (row 0 = the pending token, row i + 1 = node i) and, when asked for, features [N+1, F]. The cache then
        holds all N+1 rows: keep_path compacts it to the accepted path."""
        if not self.supports_tree:
            raise ValueError("token trees need the preallocated (static) KV cache")
        if self.cache is None:
            self.reset()
        prefix_len, rows = len(self.tokens), tree.size + 1
        self.cache.ensure_capacity(prefix_len + rows)
        # sdpa takes a bool mask (or one in the query's dtype); eager adds a float mask to the scores
        sdpa = self.model.config._attn_implementation == "sdpa"
        dtype = torch.bool if sdpa else self.model.get_input_embeddings().weight.dtype
        input_ids = torch.tensor([[pending] + tree.token_ids], dtype=torch.long, device=self.device)  # [1, N+1]
        out, features = backbone_features(
            self._backbone,
            feature_layers if want_hidden else (),
            input_ids=input_ids,
            attention_mask=tree_attention_mask(tree, prefix_len, dtype, self.device),  # [1, 1, N+1, P+N+1]
            position_ids=tree_positions(tree, prefix_len, self.device),  # [1, N+1]
            use_cache=True,
            **{self._cache_kwarg: self.cache},
        )
        self.tokens.extend([pending] + tree.token_ids)
        logits = self._lm_head(out.last_hidden_state[0])  # [N+1, V]
        return ForwardOutput(logits=logits, hidden=features[0] if want_hidden else None)

    @torch.inference_mode()
    def keep_path(self, prefix_len: int, rows: list[int]) -> None:
        """After extend_tree on a cache of prefix_len positions: keep the prefix and the tree rows `rows` (row 0, the
        pending token, first; then the accepted path's rows in order), moved down to be contiguous."""
        if not rows or rows[0] != 0:
            raise ValueError("keep_path keeps the pending token's row 0 first")
        if rows != list(range(len(rows))):  # a path that is not the first rows: move its keys and values down
            source = torch.tensor([prefix_len + r for r in rows], dtype=torch.long, device=self.device)  # [R]
            end = prefix_len + len(rows)
            for layer in self.cache.layers:
                layer.keys[:, :, prefix_len:end] = layer.keys.index_select(2, source)  # [B, H, R, D]
                layer.values[:, :, prefix_len:end] = layer.values.index_select(2, source)
        for layer in self.cache.layers:
            layer.length = prefix_len + len(rows)
        self.tokens = self.tokens[:prefix_len] + [self.tokens[prefix_len + r] for r in rows]

    @torch.inference_mode()
    def crop(self, length: int) -> None:
        """Keep the first `length` cached positions, dropping the rest (rollback after a rejection)."""
        drop = len(self.tokens) - max(length, 0)
        if drop > 0:
            self.cache.crop(-drop)  # transformers 5: a negative value drops that many trailing positions
            del self.tokens[len(self.tokens) - drop :]

    def common_prefix(self, context: list[int]) -> int:
        n = min(len(self.tokens), len(context))
        if self.tokens[:n] == context[:n]:  # the usual case, compared at C speed
            return n
        i = 0
        while i < n and self.tokens[i] == context[i]:
            i += 1
        return i
