"""q6k matmul: the int8-quads layout (the library of 2c6b05c, the revision before the planes) against the 6-bit
planes (this checkout), interleaved call by call, on the same codes; asserts the same bits.

    git worktree add /tmp/before 2c6b05c && python assets/bench/2026-12-07-zen4-formats/q6k_layouts.py /tmp/before
"""

import ctypes
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from localspec.runtime.library import SOURCES, compile_library
from localspec.runtime.q4_kernel import Q6KMatmul, _quads, pack_q6k

torch.set_num_threads(2)
old_dir = Path(sys.argv[1]) / "localspec/runtime/kernels"
tmp = Path(tempfile.mkdtemp())
old = ctypes.CDLL(str(compile_library(tuple(old_dir / p.name for p in SOURCES), tmp / "old.so")))
new = ctypes.CDLL(str(compile_library(SOURCES, tmp / "new.so")))
old_k, new_k = Q6KMatmul(old), Q6KMatmul(new)
g = torch.Generator().manual_seed(0)
for n, k in ((2048, 8192), (2048, 2048), (576, 1536)):
    codes = torch.randint(-32, 32, (n, k), generator=g).to(torch.int8)
    d = (torch.rand(n, k // 256, generator=g) * 1e-3).half()
    sc = torch.randint(-128, 128, (n, k // 16), generator=g).to(torch.int8)
    planes, scales = pack_q6k(codes, d, sc)
    quads = _quads(codes, 16)
    for rows in (1, 4, 9):
        x = torch.randn(rows, k, generator=g).to(torch.bfloat16)
        a = old_k.matmul(x, quads, scales, n)
        b = new_k.matmul(x, planes, scales, n)
        assert torch.equal(a, b), (n, k, rows)
        to, tn = [], []
        for _ in range(200):
            t = time.perf_counter()
            old_k.matmul(x, quads, scales, n)
            to.append(time.perf_counter() - t)
            t = time.perf_counter()
            new_k.matmul(x, planes, scales, n)
            tn.append(time.perf_counter() - t)
        mo, mn = statistics.median(to) * 1e6, statistics.median(tn) * 1e6
        print(
            f"N={n} K={k} rows={rows}: int8 quads {mo:8.1f} us, 6-bit planes {mn:8.1f} us, new/old {mn / mo:.3f}",
            flush=True,
        )
