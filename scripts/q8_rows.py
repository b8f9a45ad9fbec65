"""The Q8_0 LM head's matmul (kernels/q8_matmul.c) per row count, this machine's build against the AVX2 build of the
same source compiled for Haswell: median ms of an M-row call on the embedded model's head shape (49,152 × 576,
random codes), the two builds interleaved call by call, after both pass their self-checks.

    python scripts/q8_rows.py [--threads 2] [--repeats 40] [--out FILE.md]
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from localspec.models.gguf_linear import q4_kernel_here
from localspec.runtime.q4_kernel import SOURCES, Q4Kernel, compile_library, cpu_flags, pack_q8, q8_self_check

VOCAB, HIDDEN = 49152, 576
ROWS = (1, 2, 3, 5, 9, 13, 17)


def haswell_build(folder: Path) -> Q4Kernel:
    return Q4Kernel(ctypes.CDLL(str(compile_library(SOURCES, folder / "kernels-haswell.so", march="haswell"))))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    native = q4_kernel_here().kernel
    if native is None or not {"avx2", "fma", "f16c"} <= cpu_flags():
        print("needs the kernels' library and an AVX2 CPU", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as folder:
        builds = {native.isa: native}
        if native.isa != "avx2":
            builds["avx2"] = haswell_build(Path(folder))
        for name, build in builds.items():
            problem = q8_self_check(build)
            if problem is not None:
                print(f"{name}: {problem}", file=sys.stderr)
                return 1
        generator = torch.Generator().manual_seed(0)
        codes = torch.randint(-128, 128, (VOCAB, HIDDEN), generator=generator).to(torch.int8)
        d = (torch.rand(VOCAB, HIDDEN // 32, generator=generator) * 0.01).half()
        packed, scales = pack_q8(codes, d)
        times = {(name, rows): [] for name in builds for rows in ROWS}
        inputs = {rows: torch.randn(rows, HIDDEN, generator=generator).to(torch.bfloat16) for rows in ROWS}
        for round_ in range(-3, args.repeats):
            for rows in ROWS:
                for name, build in builds.items():
                    started = time.perf_counter()
                    build.matmul_q8(inputs[rows], packed, scales, VOCAB)
                    elapsed = time.perf_counter() - started
                    if round_ >= 0:
                        times[(name, rows)].append(elapsed)
    names = list(builds)
    lines = [
        f"Q8_0 LM head {VOCAB} × {HIDDEN}, median ms of {args.repeats} interleaved calls, {args.threads} threads",
        "",
        "| rows | " + " | ".join(names) + (" | avx2 ÷ " + names[0] if len(names) > 1 else "") + " |",
        "|---:|" + "---:|" * (len(names) + (len(names) > 1)),
    ]
    for rows in ROWS:
        ms = [statistics.median(times[(name, rows)]) * 1e3 for name in names]
        ratio = f" | {ms[1] / ms[0]:.2f}" if len(ms) > 1 else ""
        lines.append(f"| {rows} | " + " | ".join(f"{v:.2f}" for v in ms) + ratio + " |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
