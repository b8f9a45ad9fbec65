"""What torch's CPU int4 kernel costs per row count: the embedded target's 30 layers' linears (fused q/k/v, o,
fused gate/up, down: the shapes the lean forward calls) on random codes, median ms for M = 1..17 rows.

The kernel reads a layer's weights once per block of 4 rows, so the cost steps up at 5, 9, 13 and 17 rows: the
reason a 9-row verify forward (a tree of 8 nodes) costs far more than a 4-row one.

Run: python scripts/int4_rows.py [--threads 2] [--repeats 30]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

SHAPES = ((960, 576), (576, 576), (3072, 576), (576, 1536))  # (N, K) of one SmolLM2-135M layer's lean linears
LAYERS = 30


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    layers = []
    for _ in range(LAYERS):
        for n, k in SHAPES:
            codes = torch.randint(0, 16, (n, k), dtype=torch.int32, generator=generator)
            packed = torch._convert_weight_to_int4pack_for_cpu(codes, 1)
            scales_zeros = (torch.rand(k // 32, n, 2, generator=generator) * 0.01).bfloat16()  # [K/32, N, 2]
            layers.append((packed, scales_zeros, k))
    print(f"{torch.get_num_threads()} threads; all {len(layers)} linears, median ms")
    print("| rows | ms | × 1 row |")
    print("| ---: | ---: | ---: |")
    first = None
    for rows in range(1, 18):
        inputs = {k: torch.randn(rows, k, generator=generator).bfloat16() for _, k in SHAPES}
        times = []
        for repeat in range(args.repeats + 3):
            start = time.perf_counter()
            for packed, scales_zeros, k in layers:
                torch._weight_int4pack_mm_for_cpu(inputs[k], packed, 32, scales_zeros)
            if repeat >= 3:  # the first calls warm up
                times.append(time.perf_counter() - start)
        ms = statistics.median(times) * 1e3
        first = first or ms
        print(f"| {rows} | {ms:.1f} | {ms / first:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
