"""A causal LM with its own KV cache: extend by some tokens, crop back to a length. Used for target and draft."""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from typing import Literal

import torch

from localspec.measured import exact_rows

from .compiled import CompileMode, bucket, compile_backbone, compile_mode_from_env
from .features import backbone_features
from .int4_linear import Int4Linear
from .lean_llama import ForwardKind, LeanLlama, RowsAsPlain, backbone_for, lean_supported
from .q8_head import lm_head_for
from .static_cache import PreallocatedCache, cache_supported
from .tree import TokenTree, causal_mask, tree_attention_mask, tree_positions, tree_visibility, tree_visible_rows

CacheKind = Literal["static", "dynamic"]
AttentionPath = Literal["sdpa", "eager"]


@dataclass(frozen=True)
class ForwardSetup:
    """How every forward of a runner is computed. The kernels a CPU (or cuBLAS) picks depend on the row count, so a
    row's logits can round differently alone than inside a (K+1)-row verify forward (`localspec bench rounding`,
    assets/rounding/): with eager attention, an explicit additive mask and EXACT_ROWS dummy rows per forward (a
    1-token forward gets dummy rows after it, whose cache rows are dropped) a row rounds as it does alone.

    attention: the transformers attention implementation. explicit_mask: pass the causal additive mask built here
    instead of transformers' own (preallocated cache only: a dynamic cache may hold sliding-window layers, whose
    masks transformers builds per layer kind, and the CUDA-graph StaticCache attends over its whole capacity).
    min_rows / row_multiple: the dummy rows (the last token repeated) after the real ones; causal attention keeps
    them out of the real rows, and their cache rows are dropped. rows_as_plain (lean forward only): each real row of
    a decode or verify forward gets its own attention in plain decoding's shapes (lean_llama.RowsAsPlain), which
    made token trees and, on the Sapphire Rapids Xeon, chains bitwise too, at about 2× the verify cost
    (docs/exactness.md), so exact_setup leaves it off and exact_rows_setup turns it on."""

    attention: AttentionPath = "sdpa"
    explicit_mask: bool = False
    min_rows: int = 1
    row_multiple: int = 1  # forwards are padded up to a multiple of this many rows
    rows_as_plain: bool = False  # the lean forward computes each decode / verify row's attention in plain shapes
    attention_kernel: bool = False  # the lean forward runs decode / verify attention on attention_kernel.py

    def padded(self, rows: int) -> int:
        """The row count a forward of `rows` real rows runs with (≥ min_rows, a multiple of row_multiple)."""
        whole = -(-rows // self.row_multiple) * self.row_multiple
        return max(whole, self.min_rows) if rows else 0

    @property
    def name(self) -> str:
        if self == FAST:
            return "fast"
        rows = "1-row decode" if self.min_rows == 1 else f"≥ {self.min_rows} rows"
        rows += f", multiples of {self.row_multiple}" if self.row_multiple > 1 else ""
        plain = ", rows as plain" if self.rows_as_plain else ""
        if self.attention_kernel:
            return f"attention kernel, {rows}"
        return f"{self.attention}{' + mask' if self.explicit_mask else ''}, {rows}{plain}"


# forwards of up to this many real rows are decode / verify-sized: in the exact setup those are the rows that must
# round as plain decoding's (with rows_as_plain, each row's attention in plain decoding's shapes:
# lean_llama.RowsAsPlain). A longer forward is a prompt's prefill, which plain decoding and speculation run alike on
# the same prompt, so the lean forward runs its attention on sdpa in every setup (1.5x eager at 1,024 tokens)
AS_PLAIN_MAX_ROWS = 64
FAST = ForwardSetup()  # transformers' defaults: sdpa, its own mask, 1-row decode forwards
# (min_rows, row_multiple) per compute dtype: the fewest rows per forward, and their multiple, from which a row's result
# was measured not to depend on the row count; what was measured where is in assets/rounding/exact_rows.json
_EXACT_ROWS_BY_NAME, EXACT_ROWS_DEFAULT = exact_rows()
EXACT_ROWS = {getattr(torch, name): rows for name, rows in _EXACT_ROWS_BY_NAME.items()}


def exact_setup(dtype: torch.dtype) -> ForwardSetup:
    """The exact setup for a model computing in `dtype`: eager attention, the explicit mask, EXACT_ROWS padding."""
    min_rows, multiple = EXACT_ROWS.get(dtype, EXACT_ROWS_DEFAULT)
    return ForwardSetup(attention="eager", explicit_mask=True, min_rows=min_rows, row_multiple=multiple)


def row_invariant_layers(model: torch.nn.Module) -> bool:
    """Whether every linear of the model's decoder layers computes a row the same whatever the row count: all are
    Int4Linear on the q4 kernel (runtime/q4_kernel.py). Then the exact setup needs no dummy row: the dummy row was for
    bfloat16 F.linear, which rounds a lone row differently (docs/exactness.md)."""
    decoder = getattr(getattr(model, "model", None), "layers", None)
    if decoder is None:
        return False
    linears = [m for m in decoder.modules() if isinstance(m, (torch.nn.Linear, Int4Linear))]
    return bool(linears) and all(isinstance(m, Int4Linear) and m.row_invariant for m in linears)


def exact_setup_for(model: torch.nn.Module) -> ForwardSetup:
    """The exact setup for this model: where every decoder linear is row-invariant, 1-row decode forwards, else
    exact_setup of its dtype, with its dummy rows. Where the lean forward can also run attention on the attention
    kernel (the q4 kernel's library: a gguf target's layers take it from their q4 kernel, any other CPU target's is
    attached at load), decode / verify attention runs there: a chain row or a tree node then attends as plain
    decoding's row at that position, whatever the other rows (eager attention's sums over keys are blocked by the
    key count: docs/exactness.md)."""
    dtype = model.get_input_embeddings().weight.dtype
    lean = backbone_for(model, None, preallocated=True)[1] if lean_supported(model) else None
    kernel = isinstance(lean, LeanLlama) and lean.has_attention_kernel
    if row_invariant_layers(model):
        return ForwardSetup(attention="eager", explicit_mask=True, attention_kernel=kernel)
    return dataclasses.replace(exact_setup(dtype), attention_kernel=kernel)


def exact_rows_setup(dtype: torch.dtype) -> ForwardSetup:
    """exact_setup with every decode / verify row's attention computed in plain decoding's shapes (rows_as_plain)."""
    return dataclasses.replace(exact_setup(dtype), rows_as_plain=True)


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

    def __init__(
        self,
        model: torch.nn.Module,
        cache: CacheKind = "static",
        compile: CompileMode | None = None,
        setup: ForwardSetup = FAST,
        forward: ForwardKind | None = None,
    ) -> None:
        self.model = model.eval()
        self.setup = setup
        self.device = next(model.parameters()).device
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self.max_context = int(getattr(model.config, "max_position_embeddings", 4096) or 4096)
        self._lm_head = lm_head_for(model)  # a GGUF's Q8_0 head where one is attached, else the dense one, packed
        self.cache = None
        self.cache_kind: CacheKind = cache if cache == "dynamic" or cache_supported(model.config) else "dynamic"
        self.tokens: list[int] = []
        self.compile_mode: CompileMode = compile_mode_from_env() if compile is None else compile
        # the lean forward runs on the preallocated cache only (not the CUDA-graph StaticCache, not a dynamic one)
        preallocated = self.cache_kind == "static" and self.compile_mode != "reduce-overhead"
        self.forward_kind, self._backbone = backbone_for(model, forward, preallocated)
        self._compiled = None if self.compile_mode == "off" else compile_backbone(self._backbone, self.compile_mode)
        # transformers ≥ 5.2x names the argument `cache` (past_key_values is deprecated); older models keep the old name
        params = inspect.signature(self._backbone.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"
        self._unswitchable = False
        lean = self._backbone if isinstance(self._backbone, LeanLlama) else None
        self._attention_kernel = setup.attention_kernel and lean is not None and lean.has_attention_kernel
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
        on_kernel = self._on_attention_kernel(rows)
        if on_kernel:
            kwargs["attention"] = "kernel"  # a chain: each row sees the cache and the rows before it
        elif self.setup.rows_as_plain and self.forward_kind == "lean" and self.tokens and rows <= AS_PLAIN_MAX_ROWS:
            kwargs["rows_as_plain"] = RowsAsPlain.for_chain(rows, self.setup.padded(1))
        if self.forward_kind == "lean" and rows > AS_PLAIN_MAX_ROWS:  # a prompt's prefill: the same in every mode
            kwargs["attention"] = "sdpa"
        if self.setup.explicit_mask and isinstance(self.cache, PreallocatedCache) and not on_kernel:
            dtype = self.model.get_input_embeddings().weight.dtype
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

    def _on_attention_kernel(self, rows: int) -> bool:
        """Whether a forward of `rows` rows runs its attention on the attention kernel: the setup asks for it, the
        forward is the lean one with the kernel loaded for its layers (else the setup's eager attention and mask)
        and the rows are decode / verify-sized (a longer prefill runs sdpa in every mode)."""
        return self._attention_kernel and rows <= AS_PLAIN_MAX_ROWS

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
        dtype = torch.bool if sdpa else self.model.get_input_embeddings().weight.dtype
        input_ids = torch.tensor([[pending] + tree.token_ids], dtype=torch.long, device=self.device)  # [1, N+1]
        extra = {}
        on_kernel = self._on_attention_kernel(rows + pad)
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
