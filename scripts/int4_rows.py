"""What the CPU int4 kernels cost per row count: the embedded target's 30 layers' linears (fused q/k/v, o, fused
gate/up, down: the shapes the lean forward calls) on random codes, median ms for M = 1..17 rows, torch's
`_weight_int4pack_mm_for_cpu` and the q4 kernel (runtime/q4_kernel.py, where it loads) interleaved call by call.

torch's kernel reads a layer's weights once per block of 4 rows, so its cost steps up at 5, 9, 13 and 17 rows: the
reason a 9-row verify forward (a tree of 8 nodes) cost far more than a 4-row one. The q4 kernel expands a block of
weights once for up to 12 rows.

Run: python scripts/int4_rows.py [--threads 2] [--repeats 30]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
SHAPES = ((960, 576), (576, 576), (3072, 576), (576, 1536))  # (N, K) of one SmolLM2-135M layer's lean linears
LAYERS = 30


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from localspec.models.gguf_linear import q4_kernel_here
    from localspec.runtime.int4_linear import Int4Linear

    load = q4_kernel_here()
    kernels = {"torch": None} | ({"q4": load.kernel} if load.kernel is not None else {})
    generator = torch.Generator().manual_seed(0)
    layers = {name: [] for name in kernels}
    for _ in range(LAYERS):
        for n, k in SHAPES:
            codes = torch.randint(0, 16, (n, k), dtype=torch.int32, generator=generator)
            d = (torch.rand(n, k // 32, generator=generator) * 0.01).half()
            m = (-torch.rand(n, k // 32, generator=generator) * 0.05).half()
            for name, kernel in kernels.items():
                layers[name].append(Int4Linear.from_q4_1(codes, d, m, kernel))
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "")
    print(
        f"{cpu}, {torch.get_num_threads()} threads; all {len(layers['torch'])} linears, median ms; q4 kernel: "
        f"{load.status.reason}"
    )
    print("| rows | " + " | ".join(f"{name} ms | × 1 row" for name in kernels) + " | torch ÷ q4 |")
    print("| ---: |" + " ---: | ---: |" * len(kernels) + " ---: |")
    first: dict[str, float] = {}
    for rows in range(1, 18):
        inputs = {k: torch.randn(rows, k, generator=generator).bfloat16() for _, k in SHAPES}
        times = {name: [] for name in kernels}
        for repeat in range(args.repeats + 3):
            for name in kernels:
                start = time.perf_counter()
                for layer in layers[name]:
                    layer(inputs[layer.in_features])
                if repeat >= 3:  # the first calls warm up
                    times[name].append(time.perf_counter() - start)
        ms = {name: statistics.median(t) * 1e3 for name, t in times.items()}
        cells = []
        for name, value in ms.items():
            first.setdefault(name, value)
            cells.append(f"{value:.1f} | {value / first[name]:.2f}")
        ratio = f"{ms['torch'] / ms['q4']:.2f}" if "q4" in ms else "–"
        print(f"| {rows} | " + " | ".join(cells) + f" | {ratio} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
