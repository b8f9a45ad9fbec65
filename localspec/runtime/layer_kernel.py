"""The layer kernel (kernels/layer.c): a whole llama (qwen2, qwen3) decoder layer for the decode and verify rows of a
forward in one C call, on the q4 matmul and the attention kernel of the same library. What it removes is the torch
ops around those kernels: a 1-token forward of the embedded model ran ~90 small ops a layer (norms, rotary, cache
copies, SiLU, residuals), about half its time (assets/bench/2026-12-04-zen4/README.md's profile).

Each row is computed by fixed-order steps or by the two row-invariant kernels, so a row of a (K+1)-row verify is
bitwise the row decoded alone: plain decoding and verification both run it (the runner's exact setup, attention
"kernel"), and the exactness guarantee holds as it does for the attention kernel alone. Its rows are not bitwise
the torch ops' layer (their norm reductions and exp round differently): `self_check` bounds the gap against a
reference built from those ops on the same kernels, and `scripts/lean_forward.py --compare layer` measures it on
the embedded model's logits. It is a member of the kernels' library (runtime/library.py loads and checks it;
LOCALSPEC_LAYER_KERNEL=off leaves it out, to time or compare the two).

Words: T = rows of this call, P = positions cached before it, H = hidden size, D = head size, I = MLP width.
"""

from __future__ import annotations

import ctypes
import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .biased_linear import BiasedLinear
from .q4_kernel import GROUP, LANES, Q4Matmul, pack_q4

CHECK_PREFIX, CHECK_ROWS = 13, 9  # the self-check's cached positions and verify rows
# The self-check's bound on max |kernel − torch-op reference| over a layer's outputs, relative to max |output|.
# The two differ only in the norms' sums and SiLU's exp, so at most a bfloat16 rounding (2^-8 relative) flips at
# those points and is carried through the linears. Measured on the self-check's data, seeds 1-29: 0 (bitwise) on
# every seed; the bound admits a few such flips at the largest outputs' scale, not a wrong step.
REFERENCE_REL = 2.0**-6


KINDS = (
    "q4",
    "q4f",
    "q8",
    "q8k",
    "q4k",
    "q6k",
)  # kernels/layer.c's LINEAR_* in order: the matmul each part's layout is for
MAX_PARTS = 3  # kernels/layer.c's: q, k and v as three matmuls where their block types differ


class _LinearRef(ctypes.Structure):
    """kernels/layer.c's LinearRef, field for field."""

    _fields_ = [
        ("kind", ctypes.c_int),
        ("n", ctypes.c_int),
        *((name, ctypes.c_void_p) for name in ("codes", "scales", "bias")),
    ]


PROJECTIONS = ("qkv", "o", "gate_up", "down")


class _Args(ctypes.Structure):
    """kernels/layer.c's LayerArgs, field for field."""

    _fields_ = [
        *((name, ctypes.c_void_p) for name in ("input_norm", "post_norm")),
        *((part, _LinearRef * MAX_PARTS) for part in PROJECTIONS),
        *((f"{part}_parts", ctypes.c_int) for part in PROJECTIONS),
        *((name, ctypes.c_float) for name in ("input_eps", "post_eps", "scaling")),
        *((name, ctypes.c_int) for name in ("hidden", "heads", "kv_heads", "dim", "intermediate")),
        *((name, ctypes.c_void_p) for name in ("x", "out", "cos", "sin", "keys", "values")),
        ("kv_head", ctypes.c_long),
        ("visible", ctypes.c_void_p),
        *((name, ctypes.c_int) for name in ("rows", "prefix", "threads")),
        *((name, ctypes.c_void_p) for name in ("q_norm", "k_norm")),
        ("qk_eps", ctypes.c_float),
    ]


@dataclass(frozen=True)
class LinearPart:
    """One linear as its kernel reads it: `kind` (KINDS), N outputs, the codes and scales in that kernel's layout,
    and its bias [N] bf16 (a BiasedLinear's) or None."""

    kind: str
    n: int
    codes: torch.Tensor
    scales: torch.Tensor
    bias: torch.Tensor | None = None

    @classmethod
    def of(cls, module) -> LinearPart | None:
        """An Int4Linear or Q8Linear on one of the kernels, or a BiasedLinear of one with a bf16 bias; else None."""
        if isinstance(module, BiasedLinear):
            part, bias = cls.of(module.linear), module.bias.detach()
            if part is None or bias.dtype != torch.bfloat16 or bias.device.type != "cpu":
                return None
            return dataclasses.replace(part, bias=bias.contiguous())
        kind = getattr(getattr(module, "kernel", None), "KIND", None)
        if kind not in KINDS:
            return None
        codes, scales = (
            (module.packed, module.scales_zeros) if kind in ("q4", "q4f", "q4k") else (module.codes, module.scales)
        )
        return cls(kind, int(module.out_features), codes, scales)


@dataclass(frozen=True)
class LayerWeights:
    """One decoder layer's weights as the kernel reads them: norms [H] bfloat16, each projection as 1..MAX_PARTS
    LinearParts whose outputs lie side by side (q, k, v; gate, up)."""

    input_norm: torch.Tensor
    post_norm: torch.Tensor
    qkv: tuple[LinearPart, ...]
    o: tuple[LinearPart, ...]
    gate_up: tuple[LinearPart, ...]
    down: tuple[LinearPart, ...]
    input_eps: float
    post_eps: float
    scaling: float
    heads: int
    kv_heads: int
    dim: int
    intermediate: int
    q_norm: torch.Tensor | None = None  # qwen3: [D] bf16, each head's q and k normalised before rotary
    k_norm: torch.Tensor | None = None
    qk_eps: float = 0.0

    @property
    def hidden(self) -> int:
        return self.input_norm.shape[0]

    @property
    def qkv_width(self) -> int:
        return (self.heads + 2 * self.kv_heads) * self.dim

    @property
    def kinds(self) -> tuple[str, ...]:
        """The block layouts its linears are in, each once."""
        parts = (*self.qkv, *self.o, *self.gate_up, *self.down)
        return tuple(dict.fromkeys(part.kind for part in parts))


class BoundLayer:
    """The kernel bound to one layer's weights: `run(x, cos, sin, cache_layer, visible)` → the layer's output."""

    def __init__(self, fn, weights: LayerWeights) -> None:
        self._fn = fn
        self.weights = weights  # kept alive: the kernel reads their storage
        args = _Args()
        args.input_norm, args.post_norm = weights.input_norm.data_ptr(), weights.post_norm.data_ptr()
        for name in PROJECTIONS:
            parts = getattr(weights, name)
            slots = getattr(args, name)
            for slot, part in zip(slots, parts):  # at most MAX_PARTS (layer_weights)
                slot.kind, slot.n = KINDS.index(part.kind), part.n
                slot.codes, slot.scales = part.codes.data_ptr(), part.scales.data_ptr()
                slot.bias = part.bias.data_ptr() if part.bias is not None else None
            setattr(args, f"{name}_parts", len(parts))
        args.input_eps, args.post_eps, args.scaling = weights.input_eps, weights.post_eps, weights.scaling
        args.hidden, args.heads, args.kv_heads = weights.hidden, weights.heads, weights.kv_heads
        args.dim, args.intermediate = weights.dim, weights.intermediate
        if weights.q_norm is not None:
            args.q_norm, args.k_norm, args.qk_eps = weights.q_norm.data_ptr(), weights.k_norm.data_ptr(), weights.qk_eps
        self._args = args
        self._template = torch.empty((1, weights.kv_heads, 0, weights.dim), dtype=torch.bfloat16)  # the cache's rows

    def run(self, x, cos, sin, cache_layer, visible: torch.Tensor | None) -> torch.Tensor:
        """x [1, T, H] bf16, cos / sin [1, 1, T, D] bf16 (the rows' positions; sin with rotate_half's sign),
        cache_layer a PreallocatedLayer (rows P..P+T-1 are written), visible [T, T] uint8 or None (a chain)."""
        x = x if x.is_contiguous() else x.contiguous()
        rows = x.shape[1]
        prefix = cache_layer.append_in_place(rows, self._template)
        out = torch.empty_like(x)  # [1, T, H]
        args = self._args
        args.x, args.out, args.cos, args.sin = x.data_ptr(), out.data_ptr(), cos.data_ptr(), sin.data_ptr()
        keys, values = cache_layer.keys, cache_layer.values  # [1, Hkv, capacity, D]
        args.keys, args.values, args.kv_head = keys.data_ptr(), values.data_ptr(), keys.stride(1)
        args.visible = 0 if visible is None else visible.data_ptr()
        args.rows, args.prefix, args.threads = rows, prefix, torch.get_num_threads()
        status = self._fn(ctypes.byref(args))
        if status == -2:
            raise ValueError("layer kernel: a head layout the attention kernel does not take")
        if status:
            raise MemoryError("layer kernel: out of memory for its scratch")
        return out


class LayerKernel:
    """kernels/layer.c's lean_layer, from the kernels' library."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._fn = library.lean_layer
        self._fn.argtypes = [ctypes.POINTER(_Args)]
        self._fn.restype = ctypes.c_int

    def bind(self, weights: LayerWeights) -> BoundLayer:
        return BoundLayer(self._fn, weights)


class _CheckCache:
    """A stand-in for PreallocatedLayer with fixed buffers: what BoundLayer.run needs of a cache layer."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, length: int) -> None:
        self.keys, self.values, self.length = keys, values, length  # [1, Hkv, capacity, D]

    def append_in_place(self, rows: int, template: torch.Tensor) -> int:
        start, self.length = self.length, self.length + rows
        return start

    def clone(self) -> _CheckCache:
        return _CheckCache(self.keys.clone(), self.values.clone(), self.length)


def random_layer(seed: int) -> tuple[LayerWeights, dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]]:
    """A small random layer (H 64, 4 heads over 2, D 16, I 96) as the kernel reads it, and each linear's
    (codes [N, K], d, m [N, K/32]) for a reference."""
    generator = torch.Generator().manual_seed(seed)
    hidden, heads, kv_heads, dim, inter = 64, 4, 2, 16, 96
    shapes = {"qkv": ((heads + 2 * kv_heads) * dim, hidden), "o": (hidden, heads * dim)}
    shapes |= {"gate_up": (2 * inter, hidden), "down": (hidden, inter)}
    raw, packed = {}, {}
    for name, (n, k) in shapes.items():
        codes = torch.randint(0, 16, (n, k), generator=generator)
        d = (torch.rand(n, k // GROUP, generator=generator) * 0.4 / k**0.5).half()
        m = (-7.5 * d.float() + torch.randn(n, k // GROUP, generator=generator) * 0.01).half()  # centred weights
        raw[name] = (codes, d, m)
        packed[name] = (LinearPart("q4", n, *pack_q4(codes, d, m)),)
    norm = lambda: (1 + 0.2 * torch.randn(hidden, generator=generator)).to(torch.bfloat16)  # noqa: E731
    weights = LayerWeights(norm(), norm(), packed["qkv"], packed["o"], packed["gate_up"], packed["down"], 1e-5, 1e-5,
                           dim**-0.5, heads, kv_heads, dim, inter)  # fmt: skip
    return weights, raw


def rotary(rows: int, first: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [1, 1, T, D] bf16 for positions first..first+T-1, as lean_llama.py forms them (sin signed)."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))  # [D/2]
    freqs = torch.arange(first, first + rows).float()[:, None] * inv_freq[None]  # [T, D/2]
    emb = torch.cat((freqs, freqs), dim=-1)  # [T, D]
    sin = emb.sin()
    sin = torch.cat((-sin[:, : dim // 2], sin[:, dim // 2 :]), dim=-1)
    return emb.cos().to(torch.bfloat16)[None, None], sin.to(torch.bfloat16)[None, None]


def reference(weights: LayerWeights, q4: Q4Matmul, attention, x, cos, sin, cache: _CheckCache, visible) -> torch.Tensor:
    """The same layer from torch ops (lean_llama.py's LeanLayer) on the q4 matmul and the attention kernel."""
    rows, heads, kv_heads, dim = x.shape[1], weights.heads, weights.kv_heads, weights.dim

    def norm(w, v, eps):
        return w * F.rms_norm(v.float(), w.shape, eps=eps).to(v.dtype)

    def linear(v, name, n):
        (part,) = getattr(weights, name)  # random_layer's: one q4 part each
        return q4.matmul(v, part.codes, part.scales, n)

    qkv = linear(norm(weights.input_norm, x, weights.input_eps), "qkv", weights.qkv_width)
    qk = qkv[..., : (heads + kv_heads) * dim].reshape(1, rows, heads + kv_heads, dim).transpose(1, 2)
    qk = qk * cos + qk.roll(dim // 2, dims=-1) * sin
    v = qkv[..., (heads + kv_heads) * dim :].reshape(1, rows, kv_heads, dim).transpose(1, 2)
    start = cache.append_in_place(rows, x)
    cache.keys[:, :, start : start + rows] = qk[:, heads:]
    cache.values[:, :, start : start + rows] = v
    end = start + rows
    keys, values = cache.keys[:, :, :end], cache.values[:, :, :end]
    attended = attention.attend(qk[:, :heads], keys, values, start, visible, weights.scaling)
    x = x + linear(attended, "o", weights.hidden)
    gate, up = linear(norm(weights.post_norm, x, weights.post_eps), "gate_up", 2 * weights.intermediate).chunk(2, -1)
    return x + linear(F.silu(gate) * up, "down", weights.hidden)


def check_data(seed: int):
    """(weights, x [1, T, H], cos, sin, a cache of CHECK_PREFIX random positions) for the self-check and tests."""
    weights, _ = random_layer(seed)
    generator = torch.Generator().manual_seed(seed + 1)
    capacity = CHECK_PREFIX + CHECK_ROWS + 3
    shape = (1, weights.kv_heads, capacity, weights.dim)
    cache = _CheckCache(*(torch.randn(shape, generator=generator).to(torch.bfloat16) for _ in range(2)), CHECK_PREFIX)
    x = torch.randn(1, CHECK_ROWS, weights.hidden, generator=generator).to(torch.bfloat16)  # [1, T, H]
    cos, sin = rotary(CHECK_ROWS, CHECK_PREFIX, weights.dim)
    return weights, x, cos, sin, cache


def reference_gap(layer: LayerKernel, q4: Q4Matmul, attention, seed: int) -> float:
    """max |kernel − reference| / max |reference| over a 9-row call on check_data(seed)."""
    weights, x, cos, sin, cache = check_data(seed)
    bound = layer.bind(weights)
    out = bound.run(x, cos, sin, cache.clone(), None)
    expected = reference(weights, q4, attention, x, cos, sin, cache.clone(), None)
    return float((out.double() - expected.double()).abs().max() / expected.double().abs().max())


def self_check(layer: LayerKernel, q4: Q4Matmul, attention, seed: int = 0) -> str | None:
    """None when a 9-row call's rows and the cache rows it writes are bitwise those of 1-row calls in sequence (plain
    decoding) and of a 5 + 4 split, and its outputs are within REFERENCE_REL of the torch-op reference; otherwise
    what failed."""
    weights, x, cos, sin, cache = check_data(seed)
    bound = layer.bind(weights)
    full_cache = cache.clone()
    full = bound.run(x, cos, sin, full_cache, None)  # [1, T, H]
    for splits in ((1,) * CHECK_ROWS, (5, 4)):
        part_cache, start, outs = cache.clone(), 0, []
        for rows in splits:
            rows_cos, rows_sin = cos[:, :, start : start + rows], sin[:, :, start : start + rows]
            outs.append(bound.run(x[:, start : start + rows], rows_cos, rows_sin, part_cache, None))
            start += rows
        if not torch.equal(torch.cat(outs, dim=1), full):
            return f"a row's output changes with the rows of the call ({'+'.join(map(str, splits))})"
        if not (torch.equal(part_cache.keys, full_cache.keys) and torch.equal(part_cache.values, full_cache.values)):
            return "the keys and values it caches change with the rows of the call"
    gap = reference_gap(layer, q4, attention, seed)
    if not gap <= REFERENCE_REL:
        return f"its outputs are {gap:.3g} (relative) off the torch-op layer's, over the bound {REFERENCE_REL:.3g}"
    return None


def _projection(modules) -> tuple[LinearPart, ...] | None:
    parts = tuple(LinearPart.of(module) for module in modules)
    return parts if parts and len(parts) <= MAX_PARTS and all(parts) else None


def layer_weights(layer, attn_heads: int, kv_heads: int, dim: int, scaling: float) -> LayerWeights | None:
    """LayerWeights from a LeanLayer's modules, or None where the kernel cannot run it: every linear on one of the
    kernels (Int4Linear on q4 / q4f, Q8Linear on q8 / q8k; q, k, v and gate, up fused where they share one),
    bfloat16 norms, and D a multiple of 16."""
    projections = (
        _projection([layer.qkv] if layer.qkv is not None else [layer.q_proj, layer.k_proj, layer.v_proj]),
        _projection([layer.o_proj]),
        _projection([layer.gate_up] if layer.gate_up is not None else [layer.gate_proj, layer.up_proj]),
        _projection([layer.down]),
    )
    if not all(projections):
        return None
    norms = (layer.input_norm.weight, layer.post_norm.weight)
    head_norms = (layer.q_norm, layer.k_norm) if layer.q_norm is not None else ()
    if head_norms and head_norms[0].variance_epsilon != head_norms[1].variance_epsilon:
        return None
    weights = (*norms, *(norm.weight for norm in head_norms))
    if any(w.dtype != torch.bfloat16 or w.device.type != "cpu" for w in weights) or dim % LANES:
        return None
    q_norm, k_norm = (norm.weight.detach().contiguous() for norm in head_norms) if head_norms else (None, None)
    return LayerWeights(
        norms[0].detach().contiguous(), norms[1].detach().contiguous(), *projections,
        float(layer.input_norm.variance_epsilon), float(layer.post_norm.variance_epsilon), float(scaling),
        attn_heads, kv_heads, dim, layer.intermediate,
        q_norm, k_norm, float(head_norms[0].variance_epsilon) if head_norms else 0.0,
    )  # fmt: skip
