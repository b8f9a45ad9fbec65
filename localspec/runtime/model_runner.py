"""A causal LM with its own KV cache: extend by some tokens, crop back to a length. Used for target and draft."""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch

from localspec.config import CompileMode, ForwardKind

from .compiled import bucket, compile_backbone
from .features import backbone_features
from .lean_llama import RowsAsPlain, backbone_for
from .packed_linear import PackedLinear
from .plan import (  # noqa: F401  (the setups, re-exported where callers have always found them)
    DECODE_MAX_ROWS,
    EXACT_ROWS,
    FAST,
    CacheKind,
    ForwardPlan,
    ForwardSetup,
    exact_rows_setup,
    exact_setup,
    exact_setup_for,
    plan_forward,
    row_invariant_layers,
)
from .q8_head import embedding_format, output_rows
from .static_cache import PreallocatedCache
from .tree import TokenTree, causal_mask, tree_attention_mask, tree_positions, tree_visibility, tree_visible_rows


@dataclass(frozen=True)
class ForwardOutput:
    logits: torch.Tensor | None  # [T', V] float, next-token logits at the last T' new positions (see logits_to_keep)
    hidden: torch.Tensor | None  # [T, F] features when asked for: the last hidden state (after the final norm), after
    #                              the outputs of `feature_layers` when some are named (F = H without; see features.py)


class ModelRunner:
    """Wraps a transformers causal LM and its KV cache. Knows only token ids. Runs its ForwardPlan (plan.py) and
    decides nothing: without one, it asks plan_forward for the plan of the arguments given.

    tokens holds exactly the ids whose keys/values are in the cache, so a caller can find the common prefix
    with a new context and crop to it (transformers' candidate generators roll back the same way).

    cache "static": a preallocated cache (static_cache.py) where a crop is a length reset and no step
    concatenates, kept across answers; used for every model whose layers are all full attention. "dynamic":
    transformers' DynamicCache (the fallback for sliding-window and other layer kinds).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        cache: CacheKind = "static",
        compile: CompileMode | None = None,
        setup: ForwardSetup = FAST,
        forward: ForwardKind | None = None,
        plan: ForwardPlan | None = None,
    ) -> None:
        self.model = model.eval()
        self.plan = plan or plan_forward(model, setup=setup, forward=forward, cache=cache, compile=compile)
        self.setup = self.plan.setup
        self.device = next(model.parameters()).device
        self.vocab_size = output_rows(model)
        self.max_context = int(getattr(model.config, "max_position_embeddings", 4096) or 4096)
        output = model.get_output_embeddings()
        self._lm_head = self.plan.head if self.plan.head is not None else (
            PackedLinear.of(output) if self.plan.lm_head.value == "packed" else output
        )  # fmt: skip
        self.cache = None
        self.cache_kind: CacheKind = self.plan.cache
        self.tokens: list[int] = []
        self.compile_mode: CompileMode = self.plan.compile
        self.forward_kind, self._backbone = backbone_for(model, self.plan)
        self._compiled = None if self.compile_mode == "off" else compile_backbone(self._backbone, self.compile_mode)
        # transformers ≥ 5.2x names the argument `cache` (past_key_values is deprecated); older models keep the old name
        params = inspect.signature(self._backbone.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"
        self._unswitchable = False
        self._use_attention()

    def _use_attention(self) -> None:
        """Put the model on this runner's attention path (a model shared by runners of other setups is switched
        back and forth; a model whose attention cannot be switched keeps its own, tried once)."""
        if self.model.config._attn_implementation != self.setup.attention and not self._unswitchable:
            self.model.set_attn_implementation(self.setup.attention)
            self._unswitchable = self.model.config._attn_implementation != self.setup.attention

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
        self._use_attention()
        prefix_len, rows, backbone = len(self.tokens), len(token_ids), self._backbone
        room = self.max_context - prefix_len - rows  # dummy rows fit only within the model's context
        pad = min(self.setup.padded(rows) - rows, room)
        padded = bucket(rows + pad) if self._compiled is not None and self.tokens else None
        if padded is not None and prefix_len + padded <= self.max_context:
            backbone, pad = self._compiled, padded - rows  # a verify-sized forward: the compiled graph of its bucket
        input_ids = torch.tensor([token_ids + token_ids[-1:] * pad], dtype=torch.long, device=self.device)
        kwargs = {}
        attention = self.plan.attention(rows)  # a chain on "kernel": each row sees the cache and the rows before it
        on_kernel = attention == "kernel"
        if attention is not None:
            kwargs["attention"] = attention
        elif self.plan.rows_as_plain(rows) and self.tokens:
            kwargs["rows_as_plain"] = RowsAsPlain.for_chain(rows, self.setup.padded(1))
        # a prompt on an empty cache in sdpa needs no mask tensor: the lean forward runs sdpa's own causal attention
        masked = not on_kernel and not (attention == "sdpa" and not prefix_len)  # attention: the lean forward's
        if self.setup.explicit_mask and isinstance(self.cache, PreallocatedCache) and masked:
            dtype = embedding_format(self.model)[0]
            kwargs["attention_mask"] = causal_mask(prefix_len, rows + pad, dtype, self.device)  # [1, 1, T, P+T]
        out, features = backbone_features(
            backbone,
            feature_layers if want_hidden else (),
            input_ids=input_ids,
            use_cache=True,
            **kwargs,
            **{self._cache_kwarg: self.cache},
        )
        if pad:
            self.cache.crop(-pad)  # the padding rows' positions
        features = features[:, :rows]
        keep = rows if logits_to_keep is None else logits_to_keep
        if keep > 0:  # the LM head too runs on padded rows: the kept ones and neighbours, dropped after
            total = rows + pad
            head_rows = min(self.setup.padded(keep), total)
            start = min(rows - keep, total - head_rows)
            hidden = out.last_hidden_state[0, start : start + head_rows]  # [head_rows, H]
            logits = self._lm_head(hidden)[rows - keep - start : rows - start]  # [keep, V]
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
        self._use_attention()
        prefix_len, rows = len(self.tokens), tree.size + 1
        real = tree
        pad = self.setup.padded(rows) - rows
        if pad:  # dummy leaves under the root, after every real row: no real row sees them; keep_path drops them
            tree = TokenTree(tree.token_ids + [pending] * pad, tree.parents + [-1] * pad)
        self.cache.ensure_capacity(prefix_len + rows + pad)
        # sdpa takes a bool mask (or one in the query's dtype); eager adds a float mask to the scores
        sdpa = self.model.config._attn_implementation == "sdpa"
        dtype = torch.bool if sdpa else embedding_format(self.model)[0]
        input_ids = torch.tensor([[pending] + tree.token_ids], dtype=torch.long, device=self.device)  # [1, N+1]
        extra = {}
        on_kernel = self.plan.attention(rows + pad) == "kernel"
        if on_kernel:  # each row sees the prefix, its ancestors and itself
            extra = {"attention": "kernel", "visible": tree_visibility(tree, self.device)}  # [N+1, N+1]
        elif self.setup.rows_as_plain and self.forward_kind == "lean":  # each row as plain decoding computes it
            extra["rows_as_plain"] = RowsAsPlain.for_tree(tree_visible_rows(real), self.setup.padded(1))
        out, features = backbone_features(
            self._backbone,
            feature_layers if want_hidden else (),
            input_ids=input_ids,
            attention_mask=None if on_kernel else tree_attention_mask(tree, prefix_len, dtype, self.device),
            position_ids=tree_positions(tree, prefix_len, self.device),  # [1, N+1]
            use_cache=True,
            **extra,
            **{self._cache_kwarg: self.cache},
        )
        self.tokens.extend([pending] + real.token_ids)
        logits = self._lm_head(out.last_hidden_state[0])[:rows]  # [N+1, V]
        return ForwardOutput(logits=logits, hidden=features[0, :rows] if want_hidden else None)

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
