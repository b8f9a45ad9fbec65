"""What one layer's decode / verify attention costs per row count and cache length: the attention kernel
(runtime/attention_kernel.py), eager attention (the exact setup without it) and sdpa (the fast setup), on the
embedded model's shapes (9 query heads over 3 key-value heads, head size 64) with random bf16 queries, keys and
values, median µs over interleaved calls.

Run: python scripts/attention_rows.py [--threads 2] [--repeats 200]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

HEADS, KV_HEADS, DIM = 9, 3, 64
CASES = ((64, 1), (600, 1), (600, 5), (600, 9), (600, 17), (1500, 1), (1500, 9))  # (cached positions, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from localspec.models.gguf_linear import q4_kernel_here
    from localspec.runtime.lean_llama import _eager_attention, _sdpa
    from localspec.runtime.tree import causal_mask

    load = q4_kernel_here()
    if load.kernel is None or load.kernel.attention is None:
        raise SystemExit(f"no attention kernel here: {load.status.reason}")
    kernel = load.kernel.attention
    generator = torch.Generator().manual_seed(0)
    print(f"{torch.get_num_threads()} threads; median µs per layer over {args.repeats} interleaved calls")
    print("| cached | rows | kernel µs | eager µs | sdpa µs | eager ÷ kernel | sdpa ÷ kernel |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for prefix, rows in CASES:
        length = prefix + rows
        shape = (1, KV_HEADS, length + 64, DIM)  # a cache buffer with room, read through views as the runner does
        keys = torch.randn(shape, generator=generator).to(torch.bfloat16)
        values = torch.randn(shape, generator=generator).to(torch.bfloat16)
        q = torch.randn(1, HEADS, rows, DIM, generator=generator).to(torch.bfloat16)  # [1, H, T, D]
        k, v = keys[:, :, :length], values[:, :, :length]
        additive = causal_mask(prefix, rows, torch.bfloat16, "cpu") if rows > 1 else None
        boolean = causal_mask(prefix, rows, torch.bool, "cpu") if rows > 1 else None
        calls = {
            "kernel": (kernel.attend, (q, k, v, prefix, None, DIM**-0.5)),
            "eager": (_eager_attention, (q, k, v, additive, DIM**-0.5)),
            "sdpa": (_sdpa, (q, k, v, boolean)),
        }
        times: dict[str, list[float]] = {name: [] for name in calls}
        for call, call_args in calls.values():  # warm-up
            for _ in range(20):
                call(*call_args)
        for _ in range(args.repeats):
            for name, (call, call_args) in calls.items():
                started = time.perf_counter()
                call(*call_args)
                times[name].append(time.perf_counter() - started)
        med = {name: statistics.median(values) * 1e6 for name, values in times.items()}
        print(
            f"| {prefix} | {rows} | {med['kernel']:.0f} | {med['eager']:.0f} | {med['sdpa']:.0f} | "
            f"{med['eager'] / med['kernel']:.2f} | {med['sdpa'] / med['kernel']:.2f} |"
        )


if __name__ == "__main__":
    main()
