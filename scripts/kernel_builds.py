"""The kernels' library of the working tree against the same library built from another git revision's sources:
whether the q4 matmul gives the same bits at every row count 1..17 (on the embedded model's linear shapes, random
codes) and the attention kernel at 1..9 rows on 0..1,500 cached positions, then the median time of all 120 of the
model's lean linears per row count and of one layer's attention per cached length, the two builds interleaved.

    python scripts/kernel_builds.py [--rev HEAD] [--threads 2] [--repeats 25]

For a change that must not move a bit (a faster loop over the same arithmetic), the first line says whether it
held; the table says what it bought.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from localspec.runtime.attention_kernel import AttentionKernel  # noqa: E402
from localspec.runtime.q4_kernel import HEADERS, SOURCES, Q4Kernel, compile_library, pack_q4  # noqa: E402
from tests.test_gguf_linear import random_blocks  # noqa: E402

SHAPES = ((960, 576), (576, 576), (3072, 576), (576, 1536))  # (N, K) of one SmolLM2-135M layer's lean linears
LAYERS = 30
ROWS = (1, 2, 3, 4, 5, 9)
HEADS, KV_HEADS, DIM = 9, 3, 64  # SmolLM2-135M's attention
CACHED = (64, 600, 1500)


def attention_inputs(cached: int, rows: int, generator: torch.Generator):
    q = torch.randn(1, HEADS, rows, DIM, generator=generator).mul(3).to(torch.bfloat16)
    keys = torch.randn(1, KV_HEADS, cached + rows, DIM, generator=generator).to(torch.bfloat16)
    values = torch.randn(1, KV_HEADS, cached + rows, DIM, generator=generator).to(torch.bfloat16)
    return q, keys, values, cached, None, DIM**-0.5


def compare_attention(libraries: dict[str, Path], repeats: int) -> bool:
    kernels = {name: AttentionKernel(ctypes.CDLL(str(path))) for name, path in libraries.items()}
    generator = torch.Generator().manual_seed(3)
    same = True
    for cached in (0, 1, 15, 16, 17, 64, 600, 1500):
        for rows in (1, 2, 5, 9):
            args = attention_inputs(cached, rows, generator)
            outputs = [kernel.attend(*args) for kernel in kernels.values()]
            same = same and torch.equal(outputs[0], outputs[1])
    print(
        "attention kernel, rows 1..9 on 0..1,500 cached positions: "
        + ("bitwise the same" if same else "NOT the same bits")
    )
    print(f"\none layer's attention, 1 row, median µs of {repeats * 8} interleaved calls")
    print("| cached | " + " | ".join(kernels) + " | ÷ |\n|---:|---:|---:|---:|")
    for cached in CACHED:
        args = attention_inputs(cached, 1, generator)
        times = {name: [] for name in kernels}
        for _ in range(repeats * 8):
            for name, kernel in kernels.items():
                started = time.perf_counter()
                kernel.attend(*args)
                times[name].append(time.perf_counter() - started)
        tree, rev = (statistics.median(times[name]) * 1e6 for name in kernels)
        print(f"| {cached} | {tree:.1f} | {rev:.1f} | {rev / tree:.2f} |")
    return same


def build(sources: list[Path], out: Path) -> Q4Kernel:
    return Q4Kernel(ctypes.CDLL(str(compile_library(sources, out))))


def sources_at(rev: str, folder: Path) -> list[Path]:
    """The library's sources (and headers beside them) as they were at `rev`."""
    for path in SOURCES + HEADERS:
        relative = path.relative_to(ROOT).as_posix()
        text = subprocess.run(["git", "show", f"{rev}:{relative}"], cwd=ROOT, capture_output=True, check=True).stdout
        (folder / path.name).write_bytes(text)
    return [folder / path.name for path in SOURCES]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rev", default="HEAD")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=25)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        (folder / "rev").mkdir()
        builds = {"working tree": build(list(SOURCES), folder / "tree.so")}
        builds[args.rev] = build(sources_at(args.rev, folder / "rev"), folder / "rev.so")
        libraries = {"working tree": folder / "tree.so", args.rev: folder / "rev.so"}
        generator = torch.Generator().manual_seed(0)
        same = True
        for n, k in SHAPES:
            _, codes, d, m = random_blocks(n, k, 7)
            packed, dm = pack_q4(codes, d, m)
            x = torch.randn(17, k, generator=generator).to(torch.bfloat16)
            for rows in range(1, 18):
                outputs = [b.matmul(x[:rows], packed, dm, n) for b in builds.values()]
                same = same and torch.equal(outputs[0], outputs[1])
        print(
            f"q4 matmul, working tree vs {args.rev}, rows 1..17 on the model's shapes: "
            + ("bitwise the same" if same else "NOT the same bits")
        )
        layers = []
        for n, k in SHAPES:
            _, codes, d, m = random_blocks(n, k, 1)
            layers.append((n, *pack_q4(codes, d, m)))
        print(
            f"\nall {LAYERS * len(SHAPES)} linears, median ms of {args.repeats} interleaved passes, "
            f"{args.threads} threads"
        )
        print("| rows | working tree | " + args.rev + " | ÷ |\n|---:|---:|---:|---:|")
        for rows in ROWS:
            x = {k: torch.randn(rows, k, generator=generator).to(torch.bfloat16) for k in (576, 1536)}
            times = {name: [] for name in builds}
            for _ in range(args.repeats):
                for name, kernel in builds.items():
                    started = time.perf_counter()
                    for _ in range(LAYERS):
                        for (n, packed, dm), (_, k) in zip(layers, SHAPES):
                            kernel.matmul(x[k], packed, dm, n)
                    times[name].append(time.perf_counter() - started)
            tree, rev = (statistics.median(times[name]) * 1e3 for name in builds)
            print(f"| {rows} | {tree:.2f} | {rev:.2f} | {rev / tree:.2f} |")
        print()
        same = compare_attention(libraries, args.repeats) and same
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
