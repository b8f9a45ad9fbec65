"""The q4 and q8 matmuls of the kernels' library (kernels/q4_matmul.c, q8_matmul.c; runtime/library.py builds,
verifies and loads the library): y = x · Wᵀ for 4-bit weights in groups of 32 along K, w = q·d + m with the GGUF's
own float16 d and m (not rounded to bfloat16 as torch's int4 kernel needs them), and for Q8_0 weights w = q·d;
bfloat16 activations taken as int8 per row and group with a scale (quantized_activations), exact integer dot
products, float32 sums; and their float32-scale variants for the K-quants: q4f (the q4 layout with float32 d and m:
Q4_K's d·sc and −dmin·mn per 32, exact in float32, not in float16) and q8k (int8 codes in groups of 16 with float32
d and m, w = d·q + m: Q6_K, Q5_K, Q5_1). Two properties make them the verify-friendly kernels:

- **row-invariant**: each output is summed by one thread in one fixed order whatever the row count, so a row inside a
  (K+1)-row verify forward is bitwise the same row run alone (torch's kernels pick tiles by shape);
- **reads each weight once per 12 rows**: a (K+1)-row verify costs little more than one row.

Here: the packed layouts, each matmul's ctypes handle, and the self-checks the loader runs (against float64 and
across row counts).
"""

from __future__ import annotations

import ctypes

import torch

# The packed layout's sizes, as kernels/limits.h states them (LOCALSPEC_GROUP, LOCALSPEC_LANES): library.py refuses a
# built library whose exported limits differ, so these are checked against the C, never a second source of truth
GROUP = 32  # weights per (d, m) pair along K: a GGUF Q4_1 / Q8_0 block
K_GROUP = 16  # the q8k layout's: a Q6_K sub-block
LANES = 16  # outputs per packed block
LAYOUT_VERSION = 4  # of pack_q4's (and pack_q8's) layout: a packed-layer cache of another version is rebuilt
MAX_CHECK_ROWS = 13  # the self-check compares rows 1..13 (one pass of 12 rows and a split into 7 + 6)
FLOAT32_EPS = 2.0**-24  # unit roundoff of the float32 sums
BF16_REL = 2.0**-7  # the output's rounding to bfloat16 moves it by at most this, relative


class BlockMatmul:
    """A matmul of the library on weights packed in blocks: `matmul(x, codes, scales, out_features)`: x [..., K]
    bf16 → [..., N] in OUT. A block type's kernel is a subclass naming its C function (kernels/<KIND>_matmul.c)."""

    KIND = ""
    OUT = torch.bfloat16
    SCALES = torch.float16  # the dtype of the scales (and offsets) its layout holds

    def __init__(self, library: ctypes.CDLL):
        self._fn = getattr(library, f"{self.KIND}_matmul")
        self._fn.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int] * 4
        self._fn.restype = ctypes.c_int

    def matmul(self, x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, out_features: int) -> torch.Tensor:
        if x.dtype != torch.bfloat16:
            raise TypeError(f"the {self.KIND} kernel takes bfloat16 activations, not {x.dtype}")
        x = x if x.is_contiguous() else x.contiguous()  # [..., K]
        k = x.shape[-1]
        rows = x.numel() // k if k else 0
        out = x.new_empty((*x.shape[:-1], out_features), dtype=self.OUT)  # [..., N]
        args = (x.data_ptr(), codes.data_ptr(), scales.data_ptr(), out.data_ptr(), rows, k, out_features)
        if rows and self._fn(*args, torch.get_num_threads()):
            raise MemoryError(f"{self.KIND} kernel: out of memory for the row sums")
        return out


class Q4Matmul(BlockMatmul):
    """The q4 matmul: codes and dm in pack_q4's layout, bf16 outputs."""

    KIND, OUT = "q4", torch.bfloat16


class Q8Matmul(BlockMatmul):
    """The q8 matmul: codes and d in pack_q8's layout, float32 outputs (logits)."""

    KIND, OUT = "q8", torch.float32


class Q4FMatmul(BlockMatmul):
    """The q4 matmul with float32 d and m: pack_q4(..., torch.float32)'s layout, bf16 outputs."""

    KIND, OUT, SCALES = "q4f", torch.bfloat16, torch.float32


class Q4KMatmul(BlockMatmul):
    """The q4 matmul with GGUF Q4_K's own scales: pack_q4k's layout, bf16 outputs (q4f's bits: its d and m are made
    from these exactly)."""

    KIND, OUT, SCALES = "q4k", torch.bfloat16, torch.uint8


class Q6KMatmul(BlockMatmul):
    """The q8k matmul with GGUF Q6_K's own scales: pack_q6k's layout, float32 outputs (q8k's bits)."""

    KIND, OUT, SCALES = "q6k", torch.float32, torch.uint8


class Q8KMatmul(BlockMatmul):
    """The q8k matmul: codes, d and m in pack_q8k's layout, float32 outputs."""

    KIND, OUT, SCALES = "q8k", torch.float32, torch.float32


def pack_q4(
    codes: torch.Tensor, d: torch.Tensor, m: torch.Tensor, dtype: torch.dtype = torch.float16
) -> tuple[torch.Tensor, torch.Tensor]:
    """codes [N, K] in 0..15, d and m [N, K/32] → (packed codes [N/16, K/32, 4, 16, 4] uint8, dm [N/16, K/32, 2, 16]
    in `dtype`: float16 for the q4 kernel, float32 for q4f), the layout kernels/q4_matmul.c reads: byte b of quad t
    of lane i holds k = 4t + b in its low nibble and k = 16 + 4t + b in its high one."""
    n, k = codes.shape
    if n % LANES or k % GROUP:
        raise ValueError(f"the q4 kernel packs {LANES}·n outputs and {GROUP}·k inputs; got {n} × {k}")
    blocks, groups = n // LANES, k // GROUP
    halves = codes.to(torch.uint8).reshape(blocks, LANES, groups, 2, 4, 4)  # [NB, lane, G, half, quad, byte]
    packed = halves[:, :, :, 0] | (halves[:, :, :, 1] << 4)  # [NB, lane, G, quad, byte]
    packed = packed.permute(0, 2, 3, 1, 4).contiguous()  # [NB, G, quad, lane, byte]
    dm = torch.stack([d.to(dtype), m.to(dtype)])  # [2, N, G]
    dm = dm.reshape(2, blocks, LANES, groups).permute(1, 3, 0, 2).contiguous()  # [NB, G, 2, lane]
    return packed, dm


SUPER = 256  # a K-quant super-block: weights per float16 d and dmin
K_SCALE_BYTES = 320  # pack_q4k's scales per block of 16 outputs and super-block: d, dmin [2][16] f16; 8 × [2][16] u8


def pack_q4k(
    codes: torch.Tensor, d: torch.Tensor, dmin: torch.Tensor, sc: torch.Tensor, mn: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """A Q4_K tensor's fields: codes [N, K] in 0..15, d and dmin [N, K/256] float16, sc and mn [N, K/32] in 0..63
    (w = (d·sc)·q − dmin·mn) → (pack_q4's codes, scales [N/16, K/256, 320] uint8: per block and super-block d then
    dmin as [2][16] float16, then for each of its 8 groups sc then mn as [2][16] uint8), what q4k_matmul reads."""
    n, k = codes.shape
    if n % LANES or k % SUPER:
        raise ValueError(f"the q4k kernel packs {LANES}·n outputs and {SUPER}·k inputs; got {n} × {k}")
    blocks, supers = n // LANES, k // SUPER
    packed, _ = pack_q4(codes, torch.zeros(n, k // GROUP), torch.zeros(n, k // GROUP))
    halves = torch.stack([d.to(torch.float16), dmin.to(torch.float16)])  # [2, N, S]
    halves = halves.reshape(2, blocks, LANES, supers).permute(1, 3, 0, 2).contiguous()  # [NB, S, 2, lane]
    small = torch.stack([sc.to(torch.uint8), mn.to(torch.uint8)])  # [2, N, K/32]
    small = small.reshape(2, blocks, LANES, supers, SUPER // GROUP).permute(1, 3, 4, 0, 2)  # [NB, S, 8, 2, lane]
    scales = torch.cat([halves.view(torch.uint8).reshape(blocks, supers, -1), small.reshape(blocks, supers, -1)], -1)
    return packed, scales.contiguous()


def q4k_scales(d: torch.Tensor, dmin: torch.Tensor, sc: torch.Tensor, mn: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Q4_K's per-32 (d·sc, −dmin·mn) as float32, [N, K/32] each: exact (a float16 times a 6-bit integer)."""
    per = SUPER // GROUP
    d32, dmin32 = d.float().repeat_interleave(per, dim=1), dmin.float().repeat_interleave(per, dim=1)
    return d32 * sc.float(), -(dmin32 * mn.float())


Q6K_SCALE_BYTES = 288  # pack_q6k's scales per block of 16 outputs and super-block: d [16] f16, sc [16][16] int8


def pack_q6k(codes: torch.Tensor, d: torch.Tensor, sc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A Q6_K tensor's fields: codes [N, K] int8 (q − 32), d [N, K/256] float16, sc [N, K/16] int8 (w = (d·sc)·q) →
    (codes [N/16, K/16, 3, 16, 4] uint8: pack_q8k's quads as six_planes keeps them, 6 bits a code; scales
    [N/16, K/256, 288] uint8: per block and super-block d as [16] float16, then sc as [16 groups][16 lanes] int8),
    what q6k_matmul reads: 6.5625 bits a weight, the file's own."""
    n, k = codes.shape
    if n % LANES or k % SUPER:
        raise ValueError(f"the q6k kernel packs {LANES}·n outputs and {SUPER}·k inputs; got {n} × {k}")
    blocks, supers = n // LANES, k // SUPER
    halves = d.to(torch.float16).reshape(blocks, LANES, supers).permute(0, 2, 1).contiguous()  # [NB, S, lane]
    small = sc.to(torch.int8).reshape(blocks, LANES, supers, SUPER // K_GROUP).permute(0, 2, 3, 1)  # [NB, S, 16, lane]
    parts = [
        halves.view(torch.uint8).reshape(blocks, supers, -1),
        small.contiguous().view(torch.uint8).reshape(blocks, supers, -1),
    ]
    return six_planes(_quads(codes, K_GROUP)), torch.cat(parts, -1).contiguous()


def six_planes(quads: torch.Tensor) -> torch.Tensor:
    """Quads of codes q ∈ [−32, 31] [N/16, K/16, 4, 16, 4] int8 (_quads') → three planes [N/16, K/16, 3, 16, 4] uint8 of
    u = q + 32 (kernels/q8_matmul.c's q6k layout): u_0 & 15 | (u_1 & 15) << 4, the same of u_2 and u_3, and
    Σ_t (u_t >> 4) << 2t."""
    u = (quads.to(torch.int8) + 32).view(torch.uint8)  # q + 32 ∈ [0, 63]: no int8 overflow
    planes = u.new_empty((*u.shape[:2], 3, *u.shape[3:]))
    planes[:, :, 0] = (u[:, :, 0] & 15) | (u[:, :, 1] << 4)  # uint8 shifts drop the high bits
    planes[:, :, 1] = (u[:, :, 2] & 15) | (u[:, :, 3] << 4)
    planes[:, :, 2] = (u[:, :, 0] >> 4) | (u[:, :, 1] >> 4) << 2 | (u[:, :, 2] >> 4) << 4 | (u[:, :, 3] >> 4) << 6
    return planes


def six_codes(planes: torch.Tensor) -> torch.Tensor:
    """six_planes undone: planes [..., 3, X] uint8 (the plane dimension second to last) → quads [..., 4, X] int8."""
    first, second, high = planes.unbind(-2)
    quads = [first & 15, first >> 4, second & 15, second >> 4]
    return torch.stack([(q | ((high >> 2 * t) & 3) << 4).to(torch.int16) - 32 for t, q in enumerate(quads)],
                       dim=-2).to(torch.int8)  # fmt: skip


def _quads(codes: torch.Tensor, group: int) -> torch.Tensor:
    """int8 codes [N, K] → [N/16, K/group, group/4, 16, 4]: block, group, quad t, lane i, byte b = q[16nb+i][k] with
    k = group·g + 4t + b (a lane's four consecutive codes are one int32 lane of the dot products)."""
    n, k = codes.shape
    shaped = codes.to(torch.int8).reshape(n // LANES, LANES, k // group, group // 4, 4)  # [NB, lane, G, quad, byte]
    return shaped.permute(0, 2, 3, 1, 4).contiguous()


def pack_q8(codes: torch.Tensor, d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """codes [N, K] int8, d [N, K/32] float16 (GGUF Q8_0: w = q·d) → (codes [N/16, K/32, 8, 16, 4] int8,
    d [N/16, K/32, 16] float16), the layout kernels/q8_matmul.c reads."""
    n, k = codes.shape
    if n % LANES or k % GROUP:
        raise ValueError(f"the q8 kernel packs {LANES}·n outputs and {GROUP}·k inputs; got {n} × {k}")
    blocks, groups = n // LANES, k // GROUP
    scales = d.to(torch.float16).reshape(blocks, LANES, groups).permute(0, 2, 1).contiguous()  # [NB, G, lane]
    return _quads(codes, GROUP), scales


def pack_q8k(codes: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """codes [N, K] int8, d and m [N, K/16] float32 (w = d·q + m) → (codes [N/16, K/16, 4, 16, 4] int8,
    dm [N/16, K/16, 2, 16] float32), the layout kernels/q8_matmul.c's q8k_matmul reads."""
    n, k = codes.shape
    if n % LANES or k % K_GROUP:
        raise ValueError(f"the q8k kernel packs {LANES}·n outputs and {K_GROUP}·k inputs; got {n} × {k}")
    blocks, groups = n // LANES, k // K_GROUP
    dm = torch.stack([d.to(torch.float32), m.to(torch.float32)])  # [2, N, G]
    dm = dm.reshape(2, blocks, LANES, groups).permute(1, 3, 0, 2).contiguous()  # [NB, G, 2, lane]
    return _quads(codes, K_GROUP), dm


def quantized_activations(x: torch.Tensor, group: int = GROUP) -> torch.Tensor:
    """x [M, K] bf16 as the kernels take it (kernels/scalar.h quantize_rows), float64: per row and group,
    s·rint(x·(127 / a)) with a = max |x| and s = a / 127, in float32 as the C computes them (0 where a is 0)."""
    rows, k = x.shape
    xs = x.float().reshape(rows, k // group, group)  # [M, G, g]
    top = xs.abs().amax(dim=-1, keepdim=True)  # [M, G, 1]
    limit = torch.full_like(top, 127.0)  # a tensor: torch divides a scalar by a tensor through a reciprocal
    inverse = torch.where(top > 0, limit / top, torch.zeros_like(top))
    codes = torch.round(xs * inverse).clamp(-127, 127)  # round half to even, as rintf
    return (codes.double() * (top / limit).double()).reshape(rows, k)


def q8_reference_and_bound(
    x: torch.Tensor, codes: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(float64 x̂ · (d·q)ᵀ + x · mᵀ, the most the q8 or q8k kernel may be off it) for x [M, K], codes [N, K] int8,
    d (and q8k's m) [N, K/g] with g = K / d.shape[1] (32: q8, 16: q8k), x̂ as the kernel takes x
    (quantized_activations over groups of g). The bound: the float32 steps' first-order error, (g + 2·K/g + 2) unit
    roundoffs of Σ_k (|d·q_k·x̂_k| + |m·x_k|); the integer sums are exact; outputs stay float32."""
    n, k = codes.shape
    group = k // d.shape[1]
    d64 = d.double()[..., None]  # [N, G, 1]
    m64 = torch.zeros_like(d64) if m is None else m.double()[..., None]
    scaled = (codes.reshape(n, -1, group).double() * d64).reshape(n, k)  # [N, K]: d·q
    offset = m64.expand(n, k // group, group).reshape(n, k)  # [N, K]: m
    xs, xq = x.double(), quantized_activations(x, group)  # [M, K]
    magnitude = xq.abs() @ scaled.abs().T + xs.abs() @ offset.abs().T
    return xq @ scaled.T + xs @ offset.T, (group + 2 * (k // group) + 2) * FLOAT32_EPS * magnitude


def _problem(label: str, call, x: torch.Tensor, reference: torch.Tensor, bound: torch.Tensor) -> str | None:
    """What fails of a self-check of `call` (x rows → outputs): a row of an M-row call (M = 1..MAX_CHECK_ROWS) not
    bitwise the row alone, or an output off `reference` by more than `bound`; None when nothing does. label: the
    kernel's name in the message ("" for the q4 kernel)."""
    full = call(x)
    for rows in range(1, MAX_CHECK_ROWS + 1):
        alone = call(x[rows - 1 : rows])
        if not torch.equal(call(x[:rows]), full[:rows]) or not torch.equal(alone, full[rows - 1 : rows]):
            return f"a {label}row's output changes with the row count ({rows})"
    if not bool(((full.double() - reference).abs() <= bound).all()):
        return f"its {label}outputs are off a float64 reference by more than their rounding bound"
    return None


def q8_self_check(kernel: Q8Matmul, seed: int = 0) -> str | None:
    """None when every row of an M-row q8 call is bitwise the row alone (M = 1..MAX_CHECK_ROWS) and the outputs are
    within q8_reference_and_bound of float64; otherwise what failed."""
    generator = torch.Generator().manual_seed(seed)
    n, k = 48, 3 * GROUP * 2
    codes = torch.randint(-128, 128, (n, k), generator=generator).to(torch.int8)
    d = (torch.rand(n, k // GROUP, generator=generator) * 0.01).half()
    packed, scales = pack_q8(codes, d)
    x = torch.randn(MAX_CHECK_ROWS, k, generator=generator).to(torch.bfloat16)
    return _problem("q8 ", lambda xs: kernel.matmul(xs, packed, scales, n), x, *q8_reference_and_bound(x, codes, d))


def k_scales(generator: torch.Generator, rows: int, groups: int, top: int) -> torch.Tensor:
    """Random K-quant scales as a file holds them: a float16 super-block scale times an integer in 0..top, exact in
    float32: [rows, groups] float32."""
    d = (torch.rand(rows, groups, generator=generator) * 1e-3).half().float()
    return d * torch.randint(0, top + 1, (rows, groups), generator=generator).float()


def q8k_self_check(kernel: Q8KMatmul, seed: int = 0) -> str | None:
    """q8_self_check for the q8k matmul (codes in −32..31, float32 d and m per 16)."""
    generator = torch.Generator().manual_seed(seed)
    n, k = 48, 3 * K_GROUP * 2
    codes = torch.randint(-32, 32, (n, k), generator=generator).to(torch.int8)
    d, m = k_scales(generator, n, k // K_GROUP, 127), -k_scales(generator, n, k // K_GROUP, 63)
    packed, dm = pack_q8k(codes, d, m)
    x = torch.randn(MAX_CHECK_ROWS, k, generator=generator).to(torch.bfloat16)
    return _problem("q8k ", lambda xs: kernel.matmul(xs, packed, dm, n), x, *q8_reference_and_bound(x, codes, d, m))


def unpack_q4(packed: torch.Tensor, dm: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """pack_q4's inverse: (codes [N, K] int32, d [N, K/32] float16, m [N, K/32] float16)."""
    blocks, groups, quads, lanes, size = packed.shape
    halves = torch.stack([packed & 0xF, packed >> 4], dim=2)  # [NB, G, half, quad, lane, byte]
    codes = halves.permute(0, 4, 1, 2, 3, 5).reshape(blocks * lanes, groups * 2 * quads * size).to(torch.int32)
    d_m = dm.permute(2, 0, 3, 1).reshape(2, blocks * lanes, groups)  # [2, N, G]
    return codes, d_m[0], d_m[1]


def reference_and_bound(
    x: torch.Tensor, codes: torch.Tensor, d: torch.Tensor, m: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(float64 x̂ · (d·q)ᵀ + x · mᵀ, the most the kernel may be off it) for x [M, K], codes [N, K], d and m
    [N, K/32], where x̂ is x as int8 times its group's scale (quantized_activations): what the kernel computes, in
    float64. The bound: the output's rounding to bfloat16 (BF16_REL·|y|) plus the first-order error of the float32
    steps, (32 + 2·K/32 + 2) unit roundoffs of Σ_k (|d·q_k·x̂_k| + |m·x_k|) (Σ x of a group rounds up to 31 times,
    d·s once, and each group adds two fused multiply-adds to the sum; the integer sums are exact)."""
    n, k = codes.shape
    d64, m64 = d.double()[..., None], m.double()[..., None]  # [N, G, 1]
    scaled = (codes.reshape(n, -1, GROUP).double() * d64).reshape(n, k)  # [N, K]: d·q
    offset = m64.expand(n, k // GROUP, GROUP).reshape(n, k)  # [N, K]: m
    xs, xq = x.double(), quantized_activations(x)  # [M, K]
    reference = xq @ scaled.T + xs @ offset.T  # [M, N]
    magnitude = xq.abs() @ scaled.abs().T + xs.abs() @ offset.abs().T
    sums = (GROUP + 2 * (k // GROUP) + 2) * FLOAT32_EPS * magnitude  # [M, N]
    return reference, BF16_REL * reference.abs() + sums


def q4k_self_check(kernel: Q4KMatmul, seed: int = 0) -> str | None:
    """self_check for the q4k matmul: random Q4_K fields (K = 2 super-blocks), against float64 with d·sc and
    −dmin·mn."""
    generator = torch.Generator().manual_seed(seed)
    n, k = 48, 2 * SUPER
    codes = torch.randint(0, 16, (n, k), generator=generator)
    d, dmin = ((torch.rand(n, k // SUPER, generator=generator) * 1e-3).half() for _ in range(2))
    sc, mn = (torch.randint(0, 64, (n, k // GROUP), generator=generator) for _ in range(2))
    packed, scales = pack_q4k(codes, d, dmin, sc, mn)
    x = torch.randn(MAX_CHECK_ROWS, k, generator=generator).to(torch.bfloat16)
    reference = reference_and_bound(x, codes, *q4k_scales(d, dmin, sc, mn))
    return _problem("q4k ", lambda xs: kernel.matmul(xs, packed, scales, n), x, *reference)


def q6k_self_check(kernel: Q6KMatmul, seed: int = 0) -> str | None:
    """q8_self_check for the q6k matmul: random Q6_K fields (K = 2 super-blocks), against float64 with d·sc."""
    generator = torch.Generator().manual_seed(seed)
    n, k = 48, 2 * SUPER
    codes = torch.randint(-32, 32, (n, k), generator=generator).to(torch.int8)
    d = (torch.rand(n, k // SUPER, generator=generator) * 1e-3).half()
    sc = torch.randint(-128, 128, (n, k // K_GROUP), generator=generator).to(torch.int8)
    packed, scales = pack_q6k(codes, d, sc)
    x = torch.randn(MAX_CHECK_ROWS, k, generator=generator).to(torch.bfloat16)
    dk = d.float().repeat_interleave(SUPER // K_GROUP, dim=1) * sc.float()
    reference = q8_reference_and_bound(x, codes, dk, torch.zeros_like(dk))
    return _problem("q6k ", lambda xs: kernel.matmul(xs, packed, scales, n), x, *reference)


def self_check(kernel: Q4Matmul | Q4FMatmul, seed: int = 0, wide: bool = False) -> str | None:
    """None when every row of an M-row call is bitwise the row alone (M = 1..MAX_CHECK_ROWS) and the outputs are
    within reference_and_bound of float64; otherwise what failed. wide: the q4f kernel, with Q4_K-like float32 d
    and m."""
    generator = torch.Generator().manual_seed(seed)
    n, k = 48, 3 * GROUP * 2
    codes = torch.randint(0, 16, (n, k), generator=generator)
    if wide:
        d, m, dtype = k_scales(generator, n, k // GROUP, 63), -k_scales(generator, n, k // GROUP, 63), torch.float32
    else:
        d = (torch.rand(n, k // GROUP, generator=generator) * 0.02).half()
        m, dtype = (-torch.rand(n, k // GROUP, generator=generator) * 0.1).half(), torch.float16
    packed, dm = pack_q4(codes, d, m, dtype)
    x = torch.randn(MAX_CHECK_ROWS, k, generator=generator).to(torch.bfloat16)
    return _problem("", lambda xs: kernel.matmul(xs, packed, dm, n), x, *reference_and_bound(x, codes, d, m))
