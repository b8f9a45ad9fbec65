"""The q4 kernel (kernels/q4_matmul.c): y = x · Wᵀ for 4-bit weights in groups of 32 along K, w = q·d + m with the
GGUF's own float16 d and m (not rounded to bfloat16 as torch's int4 kernel needs them), bfloat16 activations, float32
sums. Two properties make it the verify-friendly kernel:

- **row-invariant**: each output is summed by one thread in one fixed order whatever the row count, so a row inside a
  (K+1)-row verify forward is bitwise the same row run alone (torch's kernels pick tiles by shape);
- **reads each weight once per 12 rows**: a (K+1)-row verify costs little more than one row (`scripts/int4_rows.py`
  times it against torch's `_weight_int4pack_mm_for_cpu` per row count).

It needs x86-64 and a C compiler, and one of two instruction sets (ISAS; the source has a build for each): AVX-512
BF16 with F, BW, VL (AMD Zen 4+, Intel Sapphire Rapids+), or AVX2 with FMA and F16C (most desktop CPUs). It is
compiled at first use for this CPU (`-march=native`, about a second) into the data folder's cache and loaded
with ctypes. Its OpenMP is torch's own libgomp (same soname, loaded first), so it shares torch's threads. Anything
missing, a failed build or a failed self-check (against float64 and across row counts) makes `load_q4_kernel`
return None with the reason, and the layers stay on torch's kernel.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from .attention_kernel import AttentionKernel
from .attention_kernel import self_check as attention_self_check

KERNELS = Path(__file__).with_name("kernels")
# one library: the q4 matmul, the q8 matmul (a Q8_0 LM head: q8_head.py), the attention kernel (attention_kernel.py)
# and the layer kernel on both (layer_kernel.py); HEADERS are what they include
SOURCES = tuple(KERNELS / name for name in ("q4_matmul.c", "q8_matmul.c", "attention.c", "layer.c"))
HEADERS = (KERNELS / "scalar.h", KERNELS / "attention_body.h")
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c11")
ISAS = {  # the kernel's builds, best first: the /proc/cpuinfo flags each needs (kernels/q4_matmul.c picks by target)
    "avx512bf16": ("avx512f", "avx512bw", "avx512vl", "avx512_bf16", "f16c"),
    "avx2": ("avx2", "fma", "f16c"),
}
GROUP = 32  # weights per (d, m) pair along K
LANES = 16  # outputs per block: one AVX-512 register of float32
LAYOUT_VERSION = 2  # of pack_q4's (and pack_q8's) layout: a packed-layer cache of another version is rebuilt
MAX_CHECK_ROWS = 13  # the self-check compares rows 1..13 (one pass of 12 rows and a split into 7 + 6)
FLOAT32_EPS = 2.0**-24  # unit roundoff of the float32 sums
BF16_REL = 2.0**-7  # the output's rounding to bfloat16 moves it by at most this, relative


@dataclass(frozen=True)
class KernelStatus:
    available: bool
    reason: str  # why not, or how it was built


class Q4Kernel:
    """The loaded kernel. `matmul(x, codes, dm, out_features)`: x [..., K] bf16 → [..., N] bf16; `matmul_q8(x, codes,
    d, out_features)`: the Q8_0 matmul of the same library, x [..., K] bf16 → [..., N] float32."""

    def __init__(self, library: ctypes.CDLL):
        self.library = library  # the layer kernel (layer_kernel.py) loads from it too
        library.q4_isa.restype = ctypes.c_char_p
        self.isa: str = library.q4_isa().decode()  # which build of the source runs (ISAS)
        self.attention: AttentionKernel | None = None  # the same library's attention kernel, once it passed its check
        self._fn = library.q4_matmul
        self._fn.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int] * 4
        self._fn.restype = ctypes.c_int
        self._q8 = library.q8_matmul
        self._q8.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int] * 4
        self._q8.restype = ctypes.c_int

    def matmul_q8(self, x: torch.Tensor, codes: torch.Tensor, d: torch.Tensor, out_features: int) -> torch.Tensor:
        if x.dtype != torch.bfloat16:
            raise TypeError(f"the q8 kernel takes bfloat16 activations, not {x.dtype}")
        x = x if x.is_contiguous() else x.contiguous()  # [..., K]
        k = x.shape[-1]
        rows = x.numel() // k if k else 0
        out = x.new_empty((*x.shape[:-1], out_features), dtype=torch.float32)  # [..., N]
        args = (x.data_ptr(), codes.data_ptr(), d.data_ptr(), out.data_ptr(), rows, k, out_features)
        if rows and self._q8(*args, torch.get_num_threads()):
            raise MemoryError("q8 kernel: out of memory for the activations")
        return out

    def matmul(self, x: torch.Tensor, codes: torch.Tensor, dm: torch.Tensor, out_features: int) -> torch.Tensor:
        if x.dtype != torch.bfloat16:
            raise TypeError(f"the q4 kernel takes bfloat16 activations, not {x.dtype}")
        x = x if x.is_contiguous() else x.contiguous()  # [..., K]
        k = x.shape[-1]
        rows = x.numel() // k if k else 0
        out = x.new_empty((*x.shape[:-1], out_features))  # [..., N]
        if rows and self._fn(
            x.data_ptr(),
            codes.data_ptr(),
            dm.data_ptr(),
            out.data_ptr(),
            rows,
            k,
            out_features,
            torch.get_num_threads(),
        ):
            raise MemoryError("q4 kernel: out of memory for the row sums")
        return out


def pack_q4(codes: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """codes [N, K] in 0..15, d and m [N, K/32] float16 → (packed codes [N/16, K/32, 16, 16] uint8,
    dm [N/16, K/32, 2, 16] float16), the layout kernels/q4_matmul.c reads."""
    n, k = codes.shape
    if n % LANES or k % GROUP:
        raise ValueError(f"the q4 kernel packs {LANES}·n outputs and {GROUP}·k inputs; got {n} × {k}")
    blocks, groups = n // LANES, k // GROUP
    pairs = codes.to(torch.uint8).reshape(blocks, LANES, groups, GROUP // 2, 2)  # [NB, lane, G, pair, 2]
    packed = (pairs[..., 0] | (pairs[..., 1] << 4)).permute(0, 2, 3, 1).contiguous()  # [NB, G, pair, lane]
    dm = torch.stack([d.to(torch.float16), m.to(torch.float16)])  # [2, N, G]
    dm = dm.reshape(2, blocks, LANES, groups).permute(1, 3, 0, 2).contiguous()  # [NB, G, 2, lane]
    return packed, dm


def pack_q8(codes: torch.Tensor, d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """codes [N, K] int8, d [N, K/32] float16 (GGUF Q8_0: w = q·d) → (codes [N/16, K/32, 32, 16] int8,
    d [N/16, K/32, 16] float16), the layout kernels/q8_matmul.c reads."""
    n, k = codes.shape
    if n % LANES or k % GROUP:
        raise ValueError(f"the q8 kernel packs {LANES}·n outputs and {GROUP}·k inputs; got {n} × {k}")
    blocks, groups = n // LANES, k // GROUP
    packed = codes.to(torch.int8).reshape(blocks, LANES, groups, GROUP).permute(0, 2, 3, 1).contiguous()
    scales = d.to(torch.float16).reshape(blocks, LANES, groups).permute(0, 2, 1).contiguous()  # [NB, G, lane]
    return packed, scales


def q8_reference_and_bound(x: torch.Tensor, codes: torch.Tensor, d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(float64 x · Wᵀ, the most the q8 kernel may be off it) for x [M, K], codes [N, K] int8, d [N, K/32]: its
    float32 sums' first-order bound, (32 + 2·K/32 + 2) unit roundoffs of Σ_k |d·q_k·x_k| (outputs stay float32)."""
    n, k = codes.shape
    weight = (codes.reshape(n, -1, GROUP).double() * d.double()[..., None]).reshape(n, k)  # [N, K]
    xs = x.double()
    return xs @ weight.T, (GROUP + 2 * (k // GROUP) + 2) * FLOAT32_EPS * (xs.abs() @ weight.abs().T)


def q8_self_check(kernel: Q4Kernel, seed: int = 0) -> str | None:
    """None when every row of an M-row q8 call is bitwise the row alone (M = 1..MAX_CHECK_ROWS) and the outputs are
    within q8_reference_and_bound of float64; otherwise what failed."""
    generator = torch.Generator().manual_seed(seed)
    n, k = 48, 3 * GROUP * 2
    codes = torch.randint(-128, 128, (n, k), generator=generator).to(torch.int8)
    d = (torch.rand(n, k // GROUP, generator=generator) * 0.01).half()
    packed, scales = pack_q8(codes, d)
    x = torch.randn(MAX_CHECK_ROWS, k, generator=generator).to(torch.bfloat16)
    full = kernel.matmul_q8(x, packed, scales, n)
    for rows in range(1, MAX_CHECK_ROWS + 1):
        alone = kernel.matmul_q8(x[rows - 1 : rows], packed, scales, n)
        if not torch.equal(kernel.matmul_q8(x[:rows], packed, scales, n), full[:rows]) or not torch.equal(
            alone, full[rows - 1 : rows]
        ):
            return f"a q8 row's output changes with the row count ({rows})"
    reference, bound = q8_reference_and_bound(x, codes, d)
    if not bool(((full.double() - reference).abs() <= bound).all()):
        return "its q8 outputs are off a float64 reference by more than their rounding bound"
    return None


def unpack_q4(packed: torch.Tensor, dm: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """pack_q4's inverse: (codes [N, K] int32, d [N, K/32] float16, m [N, K/32] float16)."""
    blocks, groups, pair_count, lanes = packed.shape
    pairs = torch.stack([packed & 0xF, packed >> 4], dim=-1)  # [NB, G, pair, lane, 2]
    codes = pairs.permute(0, 3, 1, 2, 4).reshape(blocks * lanes, groups * pair_count * 2).to(torch.int32)
    d_m = dm.permute(2, 0, 3, 1).reshape(2, blocks * lanes, groups)  # [2, N, G]
    return codes, d_m[0], d_m[1]


def cpu_flags() -> frozenset[str]:
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return frozenset()
    line = next((line for line in text.splitlines() if line.startswith("flags")), "")
    return frozenset(line.partition(":")[2].split())


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return name
    return None


def _missing() -> str | None:
    """Why the kernel cannot run on this machine, or None."""
    if os.environ.get("LOCALSPEC_Q4_KERNEL", "").lower() == "off":
        return "turned off (LOCALSPEC_Q4_KERNEL=off)"
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        return f"x86-64 Linux only (this is {sys.platform} {platform.machine()})"
    flags = cpu_flags()
    if not any(all(flag in flags for flag in needed) for needed in ISAS.values()):
        wanted = " or ".join(", ".join(needed) for needed in ISAS.values())
        return f"this CPU has neither instruction set the kernel is built for ({wanted})"
    if _compiler() is None:
        return "no C compiler (cc, gcc or clang) on PATH"
    return None


def _built(build_dir: Path) -> Path:
    """The shared library for these sources, compiler flags and CPU, compiled once into build_dir."""
    source = b"".join(path.read_bytes() for path in SOURCES + HEADERS)
    cpu = platform.processor() or ""
    tag = hashlib.sha256(source + " ".join(FLAGS).encode() + cpu.encode() + ",".join(sorted(cpu_flags())).encode())
    target = build_dir / f"localspec_kernels-{tag.hexdigest()[:16]}.so"
    if target.exists():
        return target
    build_dir.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    try:
        compile_library(SOURCES, partial)
    except RuntimeError:
        partial.unlink(missing_ok=True)
        raise
    partial.replace(target)
    return target


def compile_library(sources, target: Path, march: str = "native") -> Path:
    """Compile kernel sources into the shared library `target` with FLAGS, for `march` (the machine's own target by
    default; another one, e.g. "haswell", builds the AVX2 code on a machine that would run the AVX-512 one).
    RuntimeError with the compiler's last line when it fails."""
    flags = [f"-march={march}" if flag == "-march=native" else flag for flag in FLAGS]
    command = [_compiler(), *flags, *map(str, sources), "-o", str(target), "-lm"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    if result.returncode:
        raise RuntimeError(result.stderr.strip().splitlines()[-1] if result.stderr.strip() else "compiler failed")
    return target


def reference_and_bound(
    x: torch.Tensor, codes: torch.Tensor, d: torch.Tensor, m: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(float64 x · Wᵀ, the most the kernel may be off it) for x [M, K], codes [N, K], d and m [N, K/32]: the
    bfloat16 rounding of the output (BF16_REL·|y|) plus the first-order error bound of its float32 sums,
    (32 + 2·K/32 + 2) unit roundoffs of Σ_k |term_k| (a term passes through at most 32 roundings inside its group's
    sum, then two per group after). The terms are what either build adds, bounded together: avx512bf16 adds
    d·(128 + q)·x and (m − 128·d)·x, avx2 d·q·x and m·x, each at most ((128 + q)·|d| + |m| + 128·|d|)·|x|."""
    n, k = codes.shape
    d64, m64 = d.double()[..., None], m.double()[..., None]  # [N, G, 1]
    weight = (codes.reshape(n, -1, GROUP).double() * d64 + m64).reshape(n, k)  # [N, K]
    magnitude = ((codes.reshape(n, -1, GROUP).double() + 256) * d64.abs() + m64.abs()).reshape(n, k)
    xs = x.double()  # [M, K]
    reference = xs @ weight.T  # [M, N]
    sums = (GROUP + 2 * (k // GROUP) + 2) * FLOAT32_EPS * (xs.abs() @ magnitude.T)  # [M, N]
    return reference, BF16_REL * reference.abs() + sums


def self_check(kernel: Q4Kernel, seed: int = 0) -> str | None:
    """None when every row of an M-row call is bitwise the row alone (M = 1..MAX_CHECK_ROWS) and the outputs are
    within reference_and_bound of float64; otherwise what failed."""
    generator = torch.Generator().manual_seed(seed)
    n, k = 48, 3 * GROUP * 2
    codes = torch.randint(0, 16, (n, k), generator=generator)
    d = (torch.rand(n, k // GROUP, generator=generator) * 0.02).half()
    m = (-torch.rand(n, k // GROUP, generator=generator) * 0.1).half()
    packed, dm = pack_q4(codes, d, m)
    x = torch.randn(MAX_CHECK_ROWS, k, generator=generator).to(torch.bfloat16)
    full = kernel.matmul(x, packed, dm, n)
    for rows in range(1, MAX_CHECK_ROWS + 1):
        alone = kernel.matmul(x[rows - 1 : rows], packed, dm, n)  # [1, N]
        if not torch.equal(kernel.matmul(x[:rows], packed, dm, n), full[:rows]) or not torch.equal(
            alone, full[rows - 1 : rows]
        ):
            return f"a row's output changes with the row count ({rows})"
    reference, bound = reference_and_bound(x, codes, d, m)
    if not bool(((full.double() - reference).abs() <= bound).all()):
        return "its outputs are off a float64 reference by more than their rounding bound"
    return None


@dataclass(frozen=True)
class KernelLoad:
    kernel: Q4Kernel | None  # None: it cannot run here, and status says why
    status: KernelStatus


@functools.cache
def load_q4_kernel(build_dir: Path) -> KernelLoad:
    """The kernel, built into build_dir at first use and self-checked, or the reason it cannot run here."""
    missing = _missing()
    if missing is not None:
        return KernelLoad(None, KernelStatus(False, missing))
    try:
        library = ctypes.CDLL(str(_built(build_dir)))
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        return KernelLoad(None, KernelStatus(False, f"could not build it: {exc}"))
    kernel = Q4Kernel(library)
    problem = self_check(kernel) or q8_self_check(kernel)
    if problem is not None:
        return KernelLoad(None, KernelStatus(False, f"self-check failed: {problem}"))
    attention = AttentionKernel(library)
    attention_problem = attention_self_check(attention)
    kernel.attention = attention if attention_problem is None else None
    note = "" if attention_problem is None else f"; no attention kernel (self-check failed: {attention_problem})"
    return KernelLoad(kernel, KernelStatus(True, f"{kernel.isa}, built for this CPU with {_compiler()}{note}"))
