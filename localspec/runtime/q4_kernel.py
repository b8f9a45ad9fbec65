"""The q4 kernel (kernels/q4_matmul.c): y = x · Wᵀ for 4-bit weights in groups of 32 along K, w = q·d + m with the
GGUF's own float16 d and m (not rounded to bfloat16 as torch's int4 kernel needs them), bfloat16 activations, float32
sums. Two properties make it the verify-friendly kernel:

- **row-invariant**: each output is summed by one thread in one fixed order whatever the row count, so a row inside a
  (K+1)-row verify forward is bitwise the same row run alone (torch's kernels pick tiles by shape);
- **reads each weight once per 12 rows**: on the EPYC, 120 model-sized linears take 2.5 ms at 1 row and 8 ms at 9
  rows, where torch's `_weight_int4pack_mm_for_cpu` takes 3.6 and 17.5 (`scripts/int4_rows.py --kernels`).

It needs x86-64 with AVX-512 (F, BW, VL) and AVX-512 BF16 (AMD Zen 4+, Intel Sapphire Rapids+) and a C compiler;
it is compiled at first use for this CPU (`-march=native`, about a second) into the data folder's cache and loaded
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

SOURCE = Path(__file__).with_name("kernels") / "q4_matmul.c"
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c11")
CPU_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512_bf16", "f16c")
GROUP = 32  # weights per (d, m) pair along K
LANES = 16  # outputs per block: one AVX-512 register of float32
LAYOUT_VERSION = 1  # of pack_q4's layout: a packed-layer cache written under another version is rebuilt
MAX_CHECK_ROWS = 13  # the self-check compares rows 1..13 (one pass of 12 rows and a split into 7 + 6)
FLOAT32_EPS = 2.0**-24  # unit roundoff of the float32 sums
BF16_REL = 2.0**-7  # the output's rounding to bfloat16 moves it by at most this, relative


@dataclass(frozen=True)
class KernelStatus:
    available: bool
    reason: str  # why not, or how it was built


class Q4Kernel:
    """The loaded kernel. `matmul(x, codes, dm, out_features)`: x [..., K] bf16 → [..., N] bf16."""

    def __init__(self, library: ctypes.CDLL):
        self._fn = library.q4_matmul
        self._fn.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int] * 4
        self._fn.restype = ctypes.c_int

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
    lacking = [flag for flag in CPU_FLAGS if flag not in cpu_flags()]
    if lacking:
        return f"this CPU lacks {', '.join(lacking)}"
    if _compiler() is None:
        return "no C compiler (cc, gcc or clang) on PATH"
    return None


def _built(build_dir: Path) -> Path:
    """The shared library for this source, compiler flags and CPU, compiled once into build_dir."""
    source = SOURCE.read_bytes()
    cpu = platform.processor() or ""
    tag = hashlib.sha256(source + " ".join(FLAGS).encode() + cpu.encode() + ",".join(sorted(cpu_flags())).encode())
    target = build_dir / f"q4_matmul-{tag.hexdigest()[:16]}.so"
    if target.exists():
        return target
    build_dir.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    result = subprocess.run(
        [_compiler(), *FLAGS, str(SOURCE), "-o", str(partial)], capture_output=True, text=True, timeout=120
    )
    if result.returncode:
        partial.unlink(missing_ok=True)
        raise RuntimeError(result.stderr.strip().splitlines()[-1] if result.stderr.strip() else "compiler failed")
    partial.replace(target)
    return target


def reference_and_bound(
    x: torch.Tensor, codes: torch.Tensor, d: torch.Tensor, m: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(float64 x · Wᵀ, the most the kernel may be off it) for x [M, K], codes [N, K], d and m [N, K/32]: the
    bfloat16 rounding of the output (BF16_REL·|y|) plus the first-order error bound of its float32 sums,
    (32 + K/32 + 2) unit roundoffs of Σ_k |term_k|, the terms being what the kernel adds: d·(128 + q)·x and
    (m − 128·d)·x."""
    n, k = codes.shape
    d64, m64 = d.double()[..., None], m.double()[..., None]  # [N, G, 1]
    weight = (codes.reshape(n, -1, GROUP).double() * d64 + m64).reshape(n, k)  # [N, K]
    magnitude = ((codes.reshape(n, -1, GROUP).double() + 128) * d64.abs() + (m64 - 128 * d64).abs()).reshape(n, k)
    xs = x.double()  # [M, K]
    reference = xs @ weight.T  # [M, N]
    sums = (GROUP + k // GROUP + 2) * FLOAT32_EPS * (xs.abs() @ magnitude.T)  # [M, N]
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
    problem = self_check(kernel)
    if problem is not None:
        return KernelLoad(None, KernelStatus(False, f"self-check failed: {problem}"))
    return KernelLoad(kernel, KernelStatus(True, f"built for this CPU with {_compiler()}"))
