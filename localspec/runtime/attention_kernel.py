"""The attention kernel (kernels/attention.c): decode and verify attention in which each row's output depends only on
its query and the keys and values it sees, never on the other rows of the forward, the masked keys between them or
the thread count. Plain decoding (1 row) and a chain or token-tree verify then compute a position bit for bit alike,
which no shape-tuned matmul promises (a tree node's keys sit among its siblings': eager attention's sums differ).

Words: T = rows of this forward, P = positions cached before it, H / Hkv = query / key-value heads, D = head size.
A row t sees positions 0..P-1 and the forward rows j ≤ t (a chain) or those `visible[t, j]` marks (a tree: itself
and its ancestors); masked keys are skipped, so after keep_path moves an accepted path down the cache, each of its
rows saw exactly the keys plain decoding's row at that position sees, in the same order.

Every number is computed in float32; q, keys, values and the output are bfloat16, float32 or float16 alike (one C
body per element type). It is a member of the kernels' library (runtime/library.py builds, loads and checks it), whose
limits (head sizes, heads per group) it takes. The forward plan (runtime/plan.py) says where decode / verify
attention runs on it.
"""

from __future__ import annotations

import ctypes
import math

import torch

CHECK_ROWS = 9  # the self-check's forward: a pending token and 8 tree nodes
# cached positions before it: the kernel's two layouts of a call (keys in the lanes where the cache is at least as
# long as the rows, (row, head) pairs in the lanes where it is shorter), each against the rows alone
CHECK_PREFIXES = (21, 3)
FLOAT32_EPS = 2.0**-24
DTYPES = (torch.bfloat16, torch.float32, torch.float16)  # kernels/attention.c: exact_attention_bf16 / _f32 / _f16
SUFFIX = {torch.bfloat16: "bf16", torch.float32: "f32", torch.float16: "f16"}
# the output's rounding to the element type, allowed twice over: (relative, absolute: float16's subnormal spacing)
OUTPUT_ROUNDING = {torch.bfloat16: (2.0**-7, 0.0), torch.float32: (0.0, 0.0), torch.float16: (2.0**-10, 2.0**-24)}


class AttentionKernel:
    """`attend(q, keys, values, prefix, visible, scaling)`: q [1, H, T, D] (D contiguous), keys and values the cache's
    [1, Hkv, P+T, D] views (rows contiguous), all bfloat16, float32 or float16, visible [T, T] bool or None (a chain)
    → [1, T, H·D] in that dtype."""

    def __init__(self, library: ctypes.CDLL, limits):  # limits: library.Limits (kernels/limits.h)
        self.limits = limits
        self._fns = {}
        for dtype in DTYPES:
            fn = getattr(library, f"exact_attention_{SUFFIX[dtype]}")
            fn.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
            fn.argtypes += [ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p] + [ctypes.c_int] * 5
            fn.argtypes += [ctypes.c_float, ctypes.c_int]
            fn.restype = ctypes.c_int
            self._fns[dtype] = fn

    def fits(self, heads: int, kv_heads: int, dim: int, dtype: torch.dtype) -> bool:
        """Whether the kernel takes a model with these attention shapes and compute dtype (attend raises on others)."""
        lanes, max_dim, max_group = self.limits.lanes, self.limits.max_dim, self.limits.max_group
        shapes = dim % lanes == 0 and dim <= max_dim and heads % kv_heads == 0 and heads // kv_heads <= max_group
        return shapes and dtype in DTYPES

    def attend(
        self,
        q: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        prefix: int,
        visible: torch.Tensor | None,
        scaling: float,
    ) -> torch.Tensor:
        _, heads, rows, dim = q.shape
        kv_heads = keys.shape[1]
        fn = self._fns.get(q.dtype)
        if fn is None or keys.dtype != q.dtype or values.dtype != q.dtype:
            raise TypeError("the attention kernel takes bfloat16, float32 or float16 queries, keys and values alike")
        if q.stride(3) != 1 or keys.stride()[2:] != (dim, 1) or values.stride() != keys.stride():
            raise ValueError("the attention kernel reads contiguous head rows and a [Hkv, capacity, D] cache layout")
        if keys.shape[2] != prefix + rows or not self.fits(heads, kv_heads, dim, q.dtype):
            raise ValueError(
                f"attention kernel: {heads} query heads over {kv_heads} (at most {self.limits.max_group} a group), "
                f"D = {dim} (a multiple of {self.limits.lanes}, at most {self.limits.max_dim}), {keys.shape[2]} keys "
                f"for {prefix} cached + {rows} rows"
            )
        mask = None if visible is None else visible.to(torch.uint8).contiguous()  # [T, T]
        out = q.new_empty((1, rows, heads, dim))  # [1, T, H, D]
        status = fn(
            q.data_ptr(),
            q.stride(2),
            q.stride(1),
            keys.data_ptr(),
            values.data_ptr(),
            keys.stride(1),
            0 if mask is None else mask.data_ptr(),
            out.data_ptr(),
            rows,
            heads,
            kv_heads,
            dim,
            prefix,
            scaling,
            torch.get_num_threads(),
        )
        if status:  # -1; -2 (a shape it does not take) is what fits() refused above
            raise MemoryError("attention kernel: out of memory for the scores")
        return out.reshape(1, rows, heads * dim)


def reference_and_bound(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, prefix: int, visible: torch.Tensor | None, scaling: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(float64 attention [1, T, H·D], the most the kernel may be off it): the output's rounding to q's dtype
    (OUTPUT_ROUNDING) plus a first-order bound of its float32 arithmetic, relative to Σ_i p_i·|v_i| (p the softmax
    weights): the scores' dot products (D + 1 roundings each: summed in dim order, then scaled; they reach the output
    scaled by |s| through exp), exp_fixed (2 ulps) and the key-order sums (n roundings each), with 4× headroom over
    the count."""
    _, heads, rows, dim = q.shape
    groups = heads // keys.shape[1]
    k = keys.double().repeat_interleave(groups, dim=1)  # [1, H, P+T, D]
    v = values.double().repeat_interleave(groups, dim=1)
    tree = torch.ones(rows, rows).tril().bool() if visible is None else visible.bool()  # [T, T]
    seen = torch.cat([torch.ones(rows, prefix, dtype=torch.bool), tree], dim=1)  # [T, P+T]
    scores = (q.double() @ k.transpose(2, 3)) * scaling  # [1, H, T, P+T]
    scores = scores.masked_fill(~seen, -math.inf)
    weights = scores.softmax(dim=-1)
    reference = (weights @ v).transpose(1, 2).reshape(1, rows, heads * dim)
    n = prefix + rows
    magnitude = (weights @ v.abs()).transpose(1, 2).reshape(1, rows, heads * dim)
    spread = (q.double().abs() @ k.abs().transpose(2, 3) * scaling).masked_fill(~seen, 0).amax(dim=-1)  # [1, H, T]
    spread = spread.transpose(1, 2).repeat_interleave(dim, dim=2)  # [1, T, H·D]
    relative = 4 * FLOAT32_EPS * ((dim + 1) * spread + 2 * n + 8)
    rounding, floor = OUTPUT_ROUNDING[q.dtype]
    return reference, rounding * reference.abs() + floor + relative * magnitude


def self_check(kernel: AttentionKernel, seed: int = 0) -> str | None:
    """None when, in each element type and on each cache length of CHECK_PREFIXES, each row of a tree-masked 9-row
    call is bitwise the same row computed alone on the keys it sees (the plain decode of that position), the chain
    form agrees with the tree form of a chain, and every output is within reference_and_bound of float64; otherwise
    what failed."""
    for dtype in DTYPES:
        problem = _self_check_in(kernel, seed, dtype)
        if problem is not None:
            return f"{SUFFIX[dtype]}: {problem}"
    return None


def _self_check_in(kernel: AttentionKernel, seed: int, dtype: torch.dtype) -> str | None:
    generator = torch.Generator().manual_seed(seed)
    for prefix in CHECK_PREFIXES:
        problem = _tree_check(kernel, generator, dtype, prefix)
        if problem is not None:
            return f"{prefix} cached: {problem}"
    return None


def _tree_check(kernel: AttentionKernel, generator: torch.Generator, dtype: torch.dtype, prefix: int) -> str | None:
    heads, kv_heads, dim, rows = 6, 2, 64, CHECK_ROWS
    scaling = dim**-0.5
    capacity = prefix + rows + 3
    keys = torch.randn(1, kv_heads, capacity, dim, generator=generator).to(dtype)  # [1, Hkv, cap, D]
    values = torch.randn(1, kv_heads, capacity, dim, generator=generator).to(dtype)
    q = torch.randn(1, heads, rows, dim, generator=generator).mul(2).to(dtype)  # [1, H, T, D]
    parents = [-1, 0, 0, 1, 1, 2, 3, 5]  # 8 nodes under the pending row 0
    visible = torch.eye(rows, dtype=torch.bool)
    visible[:, 0] = True
    for node, parent in enumerate(parents):
        while parent >= 0:
            visible[node + 1, parent + 1] = True
            parent = parents[parent]
    length = prefix + rows
    tree = kernel.attend(q, keys[:, :, :length], values[:, :, :length], prefix, visible, scaling)  # [1, T, H·D]
    for row in range(rows):
        path = [prefix + j for j in range(rows) if visible[row, j]]  # the keys the row sees, as plain decoding has them
        order = torch.tensor(list(range(prefix)) + path)
        k_plain = keys.clone()
        v_plain = values.clone()
        k_plain[:, :, : len(order)] = keys[:, :, order]
        v_plain[:, :, : len(order)] = values[:, :, order]
        seen = len(order)
        query = q[:, :, row : row + 1]  # [1, H, 1, D]
        alone = kernel.attend(query, k_plain[:, :, :seen], v_plain[:, :, :seen], seen - 1, None, scaling)
        if not torch.equal(alone[0, 0], tree[0, row]):
            return f"tree row {row} differs from the same row decoded alone"
    chain = kernel.attend(q, keys[:, :, :length], values[:, :, :length], prefix, None, scaling)
    lower = torch.ones(rows, rows).tril()
    causal = kernel.attend(q, keys[:, :, :length], values[:, :, :length], prefix, lower, scaling)
    if not torch.equal(chain, causal):
        return "a chain's causal rows differ from the same rows given as a tree"
    reference, bound = reference_and_bound(q, keys[:, :, :length], values[:, :, :length], prefix, visible, scaling)
    if not bool(((tree.double() - reference).abs() <= bound).all()):
        return "its outputs are off a float64 reference by more than their rounding bound"
    return None
