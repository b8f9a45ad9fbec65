"""A llama backbone forward without transformers' per-layer machinery, over the same modules and weights.

transformers' LlamaModel spends a decode step's time outside the matmuls on work a single-sequence decoder does not
need: a mask built per forward through a general mask interface, rotary tables recomputed from the positions every
forward, per-layer attention dispatch and output recording hooks. A profile of plain decoding with the int4 GGUF
weights put about a quarter of a step there (README: Weight formats and forward costs). This forward keeps only the
arithmetic, each op the one transformers runs, in the same order and dtype, so its output is bitwise transformers'
for the same attention (tests/test_lean_llama.py), and adds two things:

  rotary table   cos/sin [positions, D] computed once per capacity (the same float32 product transformers forms
                 per forward: position · inv_freq, elementwise), gathered by position
  fused linears  q, k, v as one linear and gate, up as one, where the weights allow (dense, or int4 codes of the
                 same layout): one kernel call where there were three and two; each output column is computed as
                 before (checked bitwise at build, else the layers stay separate)

Per-forward choices come from the runner: `attention` (a long prompt's prefill runs sdpa in every setup; "kernel" runs
attention_kernel.py, each row as plain decoding computes it, with `visible` for a tree, and where it loads the whole
layer in one C call: layer_kernel.py) and `rows_as_plain` (each
decode / verify row's eager attention in plain decoding's shapes, RowsAsPlain).

Words: T = rows of this forward, P = positions already cached, H / Hkv = query / key-value heads, D = head size.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from localspec.config import ForwardKind

from .attention_kernel import AttentionKernel
from .layer_kernel import BoundLayer, LayerKernel, layer_weights
from .memory import release_free_memory
from .plan import AttentionKind, ForwardPlan, lean_supported
from .q8_head import embedding_format
from .static_cache import PreallocatedCache
from .tree import causal_mask

__all__ = ["ForwardKind", "LeanLlama", "RowsAsPlain", "backbone_for", "lean_supported"]
_BUILT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model → its LeanLlama (runners of a model share it)


@dataclass(frozen=True)
class LeanOutput:
    last_hidden_state: torch.Tensor  # [1, T, H] after the final norm
    hidden_states: tuple[torch.Tensor, ...] | None  # (embeddings, layer 0 output, …) when asked for, as transformers


def _fused(layers: list[nn.Module]) -> nn.Module | None:
    """One linear computing the given bias-free linears' outputs side by side, or None when they cannot fuse. The
    parts are rebound to views of the fused weight rows (dense weights, int4 codes), so fusing adds no memory but
    the int4 scales (the kernel reads them only contiguous, so each part keeps its own)."""
    if all(type(layer) is nn.Linear and layer.bias is None for layer in layers):
        weight = torch.cat([layer.weight.detach() for layer in layers])  # [ΣN, K]
        fused = nn.Linear(weight.shape[1], weight.shape[0], bias=False, dtype=weight.dtype, device=weight.device)
        fused.weight = nn.Parameter(weight, requires_grad=False)
        for layer, rows in zip(layers, weight.split([layer.out_features for layer in layers]), strict=True):
            layer.weight = nn.Parameter(rows, requires_grad=False)
        return fused
    kind = type(layers[0])  # block layers (Int4Linear, q8_head.Q8Linear) of one kind stack their blocks
    if hasattr(kind, "concatenated") and all(type(layer) is kind for layer in layers):
        fused = kind.concatenated(layers)
        if fused is not None:
            fused.share_with(layers)
        return fused
    return None


def _columns_unchanged(fused: nn.Module, parts: list[nn.Module], x: torch.Tensor) -> bool:
    """Whether the fused linear gives each part's output bitwise, for 1 and 2 rows of x [2, K]."""
    for rows in (1, 2):
        joined = fused(x[:rows])
        alone = torch.cat([part(x[:rows]) for part in parts], dim=-1)
        if not torch.equal(joined, alone):
            return False
    return True


class LeanLayer(nn.Module):
    def __init__(
        self,
        layer: nn.Module,
        config,
        probe: torch.Tensor,
        attention: AttentionKernel | None = None,
        layer_kernel: LayerKernel | None = None,
    ) -> None:  # probe [2, H] in the compute dtype; attention / layer_kernel: the plan's kernels (None: not planned)
        super().__init__()
        attn, mlp = layer.self_attn, layer.mlp
        self.input_norm, self.post_norm = layer.input_layernorm, layer.post_attention_layernorm
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = attn.head_dim
        self.scaling = attn.scaling
        self.o_proj, self.down = attn.o_proj, mlp.down_proj
        qkv = [attn.q_proj, attn.k_proj, attn.v_proj]
        gate_up = [mlp.gate_proj, mlp.up_proj]
        fused_qkv, fused_gu = _fused(qkv), _fused(gate_up)
        self.qkv = fused_qkv if fused_qkv is not None and _columns_unchanged(fused_qkv, qkv, probe) else None
        self.gate_up = fused_gu if fused_gu is not None and _columns_unchanged(fused_gu, gate_up, probe) else None
        self.q_proj, self.k_proj, self.v_proj = qkv
        self.q_norm, self.k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)  # qwen3's, per head
        self.gate_proj, self.up_proj = gate_up
        self.splits = (self.heads * self.head_dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim)
        self.intermediate = mlp.gate_proj.out_features
        self.attention_kernel = attention  # attention_kernel.py, where the plan runs decode / verify attention on it
        self.layer_kernel = self._bound(layer_kernel)  # layer_kernel.py: the whole layer of "kernel" forwards

    def _bound(self, layer_kernel: LayerKernel | None) -> BoundLayer | None:
        """The plan's layer kernel bound to this layer's weights (None where it has none, or they are not its
        layout)."""
        if layer_kernel is None or self.attention_kernel is None:
            return None
        weights = layer_weights(self, self.heads, self.kv_heads, self.head_dim, self.scaling)
        return layer_kernel.bind(weights) if weights is not None else None

    def forward(self, x, cos, sin, mask, cache_layer, path: AttentionKind, as_plain=None, visible=None):  # x [1, T, H]
        if path == "kernel" and self.layer_kernel is not None:
            return self.layer_kernel.run(x, cos, sin, cache_layer, visible)
        rows, heads, kv_heads, dim = x.shape[1], self.heads, self.kv_heads, self.head_dim
        h = _rms_norm(self.input_norm, x)
        if self.qkv is not None:
            qkv = self.qkv(h)  # [1, T, (H + 2·Hkv)·D]
            qk, v = qkv[..., : (heads + kv_heads) * dim], qkv[..., (heads + kv_heads) * dim :]
        else:
            qk, v = torch.cat([self.q_proj(h), self.k_proj(h)], dim=-1), self.v_proj(h)
        qk = qk.reshape(1, rows, heads + kv_heads, dim)  # [1, T, H + Hkv, D]
        if self.q_norm is not None:  # qwen3: each head's q and k normalised before RoPE
            qk = torch.cat([self.q_norm(qk[:, :, :heads]), self.k_norm(qk[:, :, heads:])], dim=2)
        qk = qk.transpose(1, 2)  # [1, H + Hkv, T, D]
        qk = qk * cos + qk.roll(dim // 2, dims=-1) * sin  # RoPE on q and k at once
        q, k = qk[:, :heads], qk[:, heads:]  # [1, H, T, D], [1, Hkv, T, D]
        v = v.reshape(1, rows, kv_heads, dim).transpose(1, 2)  # [1, Hkv, T, D]
        keys, values = cache_layer.update(k, v)  # [1, Hkv, P+T, D]
        if path == "kernel":
            attended = self.attention_kernel.attend(q, keys, values, keys.shape[2] - rows, visible, self.scaling)
        else:
            if as_plain is not None:
                attn = _rows_as_plain(q, keys, values, *as_plain, self.scaling)
            elif path == "eager":
                attn = _eager_attention(q, keys, values, mask, self.scaling)
            else:
                attn = _sdpa(q, keys, values, mask)
            attended = attn.transpose(1, 2).reshape(1, rows, -1)  # [1, H, T, D] → [1, T, H·D]
        x = x + self.o_proj(attended)
        h = _rms_norm(self.post_norm, x)
        if self.gate_up is not None:
            gate, up = self.gate_up(h).split(self.intermediate, dim=-1)
        else:
            gate, up = self.gate_proj(h), self.up_proj(h)
        return x + self.down(F.silu(gate) * up)


def _rms_norm(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """transformers' LlamaRMSNorm (weight · (x / rms(x) in float32, back in x's dtype)) in one fused kernel."""
    return norm.weight * F.rms_norm(x.float(), norm.weight.shape, eps=norm.variance_epsilon).to(x.dtype)


def _repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """[1, Hkv, L, D] → [1, Hkv·groups, L, D], each key-value head repeated for its query heads (as transformers)."""
    if groups == 1:
        return x
    batch, heads, length, dim = x.shape
    return x[:, :, None].expand(batch, heads, groups, length, dim).reshape(batch, heads * groups, length, dim)


def _eager_attention(q, keys, values, mask, scaling):  # q [1, H, T, D], keys/values [1, Hkv, L, D]
    groups = q.shape[1] // keys.shape[1]
    keys, values = _repeat_kv(keys, groups), _repeat_kv(values, groups)
    scores = torch.matmul(q, keys.transpose(2, 3)) * scaling  # [1, H, T, L]
    if mask is not None:
        scores = scores + mask
    weights = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(weights, values)  # [1, H, T, D]


@dataclass(frozen=True)
class RowsAsPlain:
    """Which rows of a forward are real and what each sees, so the exact setup can compute each real row's attention
    in plain decoding's own shapes (see _rows_as_plain). The runner builds it (chain / tree); the forward runs it.

    visible[r]: for real row r, the forward rows it sees in order (its ancestors and itself; a chain's row r sees
    rows 0..r). plain_rows: the rows of a 1-token forward in this setup (ForwardSetup.padded(1)). Rows after the
    real ones are dummies: their attention output is left zero (no real row reads it)."""

    visible: tuple[tuple[int, ...], ...]
    plain_rows: int
    chain: bool  # row r sees rows 0..r: its keys are a prefix of the cache (views, no gather)

    @classmethod
    def for_chain(cls, real_rows: int, plain_rows: int) -> RowsAsPlain:
        return cls(tuple(tuple(range(r + 1)) for r in range(real_rows)), plain_rows, chain=True)

    @classmethod
    def for_tree(cls, visible: tuple[tuple[int, ...], ...], plain_rows: int) -> RowsAsPlain:
        return cls(visible, plain_rows, chain=False)


@dataclass(frozen=True)
class _RowGroup:
    rows: torch.Tensor  # [n] int64: forward rows that see the same number of keys
    keys: torch.Tensor | None  # [n · length] int64 cache positions, plain decoding's order (None: a chain's prefix)
    length: int  # keys each row sees: the prefix, its ancestors and itself


def _row_groups(plan: RowsAsPlain, prefix: int, device) -> list[_RowGroup]:
    if plan.chain:  # one row per group: row r's keys are cache positions 0 .. prefix + r
        rows = range(len(plan.visible))
        return [_RowGroup(torch.tensor([r], device=device), None, prefix + r + 1) for r in rows]
    by_length: dict[int, list[int]] = {}
    for row, seen in enumerate(plan.visible):
        by_length.setdefault(len(seen), []).append(row)
    groups = []
    for count, rows in sorted(by_length.items()):
        keys = [list(range(prefix)) + [prefix + j for j in plan.visible[row]] for row in rows]  # [n][P + count]
        flat = torch.tensor(keys, dtype=torch.long, device=device).flatten()
        groups.append(_RowGroup(torch.tensor(rows, dtype=torch.long, device=device), flat, prefix + count))
    return groups


def _rows_as_plain(q, keys, values, plan: RowsAsPlain, groups: list[_RowGroup], scaling):
    """Attention of a forward's real rows, each computed as plain decoding computes it. Inside one multi-row
    attention a row's sums can round differently from the same row in plain decoding's 2-row forward: a tree node's
    keys are scattered among its siblings', and on the Sapphire Rapids Xeon even a chain's rows round differently
    for some row counts and long contexts (oneDNN picks its blocking by shape). Here each real row runs in the exact
    setup's plain shapes: M = plain_rows query rows (itself repeated), its keys in plain decoding's order, then one
    masked key per dummy row. q [1, H, T, D], keys/values [1, Hkv, P+T, D] → [1, H, T, D]. A chain's keys are views
    of the cache; a tree's are gathered (a copy of R · (P + depth) positions), so this is the exact setup's alone."""
    dim, kv_heads, dummies = q.shape[-1], keys.shape[1], plan.plain_rows - 1
    out = q.new_zeros(q.shape)
    for group in groups:
        n, length = group.rows.numel(), group.length
        gathered = []
        for cache in (keys, values):
            if group.keys is None and length + dummies <= cache.shape[2]:  # the next positions stand in, masked
                gathered.append(cache[:, :, : length + dummies])  # [1, Hkv, L + dummies, D]
                continue
            rows = cache[:, :, :length] if group.keys is None else cache[0].index_select(1, group.keys)
            rows = rows.reshape(kv_heads, n, length, dim).transpose(0, 1)  # [n, Hkv, L, D]
            gathered.append(torch.cat([rows] + [rows[:, :, -1:]] * dummies, dim=2))  # [n, Hkv, L + dummies, D]
        query = q[0].index_select(1, group.rows).transpose(0, 1)[:, :, None]  # [n, H, 1, D]
        mask = torch.zeros((1, 1, plan.plain_rows, length + dummies), dtype=q.dtype, device=q.device)
        mask[..., length:] = torch.finfo(q.dtype).min  # the dummy keys hidden, as causal_mask hides them from row 0
        attn = _eager_attention(query.expand(-1, -1, plan.plain_rows, -1), *gathered, mask, scaling)  # [n, H, M, D]
        out[0].index_copy_(1, group.rows, attn[:, :, 0].transpose(0, 1))  # [H, n, D]
    return out


# the mask of a prompt read from an empty cache: sdpa's own causal attention (is_causal), which skips the blocks above
# the diagonal that a mask tensor would have it compute and drop (the same outputs: a masked key adds exactly 0)
CAUSAL = "causal"


def _sdpa(q, keys, values, mask):  # grouped-query attention without copying the keys and values per query head
    gqa = q.shape[1] != keys.shape[1]
    if mask is CAUSAL:
        return F.scaled_dot_product_attention(q, keys, values, is_causal=True, enable_gqa=gqa)
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=gqa)


class LeanLlama(nn.Module):
    """The backbone a ModelRunner calls in place of `model.model` for a lean_supported llama: same keyword
    arguments (input_ids, attention_mask, position_ids, cache, output_hidden_states), same cache object (a
    PreallocatedCache), last hidden state and per-layer hidden states as transformers returns them."""

    def __init__(self, model: nn.Module, plan: ForwardPlan) -> None:
        super().__init__()
        base = model.model
        config = model.config
        self.config = config
        self.embed = base.embed_tokens
        self.norm = base.norm
        generator = torch.Generator().manual_seed(0)
        dtype, device = embedding_format(model)
        probe = torch.randn(2, config.hidden_size, generator=generator).to(device=device, dtype=dtype)  # [2, H]
        attention, layer_kernel = plan.attention_kernel, plan.layer
        self.layers = nn.ModuleList()
        for layer in base.layers:
            self.layers.append(LeanLayer(layer, config, probe, attention, layer_kernel))
            # its fused linears' parts let go of their own codes and scales (now views of the fused ones): free heap
            # chunks between kept weights, which glibc neither reuses for the next fused copy nor returns by itself
            # (a 1.7B model would hold both copies, +0.15 GB, for good)
            release_free_memory()
        rotary = base.rotary_emb
        self.register_buffer("inv_freq", rotary.inv_freq.detach().float().clone(), persistent=False)  # [D/2]
        self.attention_scaling = float(rotary.attention_scaling)
        self._cos = self._sin = None  # [positions, D] in the compute dtype, grown on demand

    @property
    def has_attention_kernel(self) -> bool:
        """Whether every layer can run attention "kernel" (the plan put decode / verify attention there)."""
        return all(layer.attention_kernel is not None for layer in self.layers)

    @property
    def on_layer_kernel(self) -> bool:
        """Whether attention "kernel" forwards run every layer whole on the layer kernel (layer_kernel.py)."""
        return all(layer.layer_kernel is not None for layer in self.layers)

    @property
    def fused(self) -> tuple[int, int]:
        """(layers whose q, k, v run fused, layers whose gate, up run fused)."""
        return sum(lay.qkv is not None for lay in self.layers), sum(lay.gate_up is not None for lay in self.layers)

    def _rotary(self, positions: torch.Tensor, need: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [1, 1, T, D] for positions [T] (transformers' values: position · inv_freq in float32).
        rotate_half(x) · sin = [−x₂, x₁] · sin equals roll(x, D/2) · [−sin₁, sin₂] exactly (negation is exact), so
        sin carries the sign and the layers roll instead of slicing, negating and concatenating. need: a bound on the
        largest position + 1 known on the host (no device read)."""
        if self._cos is None or self._cos.shape[0] < need or self._cos.dtype != dtype:
            size = max(need, 2 * (self._cos.shape[0] if self._cos is not None else 256))
            steps = torch.arange(size, device=self.inv_freq.device)
            freqs = steps[:, None].float() * self.inv_freq[None, :]  # [positions, D/2]
            emb = torch.cat((freqs, freqs), dim=-1)  # [positions, D]
            self._cos = (emb.cos() * self.attention_scaling).to(dtype)
            sin = (emb.sin() * self.attention_scaling).to(dtype)
            half = sin.shape[-1] // 2
            self._sin = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)  # rotate_half's sign, folded in
        return self._cos[positions][None, None], self._sin[positions][None, None]

    def forward(
        self,
        input_ids: torch.Tensor,  # [1, T]
        attention_mask: torch.Tensor | None = None,  # [1, 1, T, P+T]: additive (eager) or bool (sdpa)
        position_ids: torch.Tensor | None = None,  # [1, T]
        cache: PreallocatedCache | None = None,
        output_hidden_states: bool = False,
        use_cache: bool = True,
        rows_as_plain: RowsAsPlain | None = None,  # the exact setup: real rows computed in plain decoding's shapes
        attention: AttentionKind | None = None,  # this forward's attention (default: the model's)
        visible: torch.Tensor | None = None,  # [T, T] bool, attention "kernel": the rows each row sees (None: causal)
        **unused,
    ) -> LeanOutput:
        if cache is None:
            cache = unused.get("past_key_values")
        if not isinstance(cache, PreallocatedCache):
            raise ValueError("the lean llama forward runs on a PreallocatedCache")
        x = self.embed(input_ids)  # [1, T, H]
        rows, prefix = input_ids.shape[1], cache.get_seq_length()
        if position_ids is None:
            position_ids = torch.arange(prefix, prefix + rows, device=x.device)[None]  # [1, T]
        cos, sin = self._rotary(position_ids[0], prefix + rows, x.dtype)  # a tree's positions are ≤ prefix + depth
        path: AttentionKind = attention or self.config._attn_implementation
        if path == "kernel" and not self.has_attention_kernel:
            raise ValueError("the attention kernel is not loaded for this model's layers (see attention_kernel.py)")
        eager = path == "eager"
        mask = None if path == "kernel" else attention_mask
        if mask is None and rows > 1 and path == "sdpa" and prefix == 0 and rows_as_plain is None:
            mask = CAUSAL  # a prompt on an empty cache: row i sees rows ≤ i
        elif mask is None and rows > 1 and path != "kernel":  # a chain: row i sees the cache and rows ≤ i
            mask = causal_mask(prefix, rows, x.dtype if eager else torch.bool, x.device)  # [1, 1, T, P+T]
        if mask is not None and mask is not CAUSAL and not eager and mask.dtype != torch.bool:
            mask = mask.to(x.dtype)
        as_plain = None
        if eager and rows_as_plain is not None:
            as_plain = (rows_as_plain, _row_groups(rows_as_plain, prefix, x.device))
        if visible is not None:
            visible = visible.to(torch.uint8).contiguous()  # [T, T], as the kernels read it, once per forward
        hidden = [x] if output_hidden_states else None
        for layer, cache_layer in zip(self.layers, cache.layers, strict=True):
            x = layer(x, cos, sin, mask, cache_layer, path, as_plain, visible)
            if hidden is not None:
                hidden.append(x)
        x = _rms_norm(self.norm, x)
        if hidden is not None:
            hidden[-1] = x
        return LeanOutput(last_hidden_state=x, hidden_states=tuple(hidden) if hidden is not None else None)


def backbone_for(model: nn.Module, plan: ForwardPlan) -> tuple[ForwardKind, nn.Module]:
    """(the plan's forward, its backbone): the lean forward (built once per model, shared by its runners) or
    transformers' own."""
    if plan.forward != "lean":
        return "transformers", model.base_model
    lean = _BUILT.get(model)
    if lean is None:
        lean = _BUILT[model] = LeanLlama(model, plan)
    return "lean", lean
