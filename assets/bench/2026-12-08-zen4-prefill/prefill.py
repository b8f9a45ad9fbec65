"""A prompt read on the layer kernel against the same prompt on sdpa's forward, by prompt length, the same code: the
plan's bound switched per call (runtime/plan.py PREFILL_KERNEL_MAX_ROWS), the prompt read in forwards of the engine's
PREFILL_CHUNK tokens as the engine reads it. Random token ids (a prefill's speed does not depend on them), median of
ROUNDS alternated reads after one warm-up round; the model from --model-file or the embedded default. Prints a
Markdown table.

    .venv/bin/python assets/bench/2026-12-08-zen4-prefill/prefill.py [--model-file F] [--sizes 65,128,...] [--rounds 5]
"""

import argparse
import statistics
import time

import torch

import localspec.runtime.plan as plan
from localspec.cli.common import load_session, resolve_pair
from localspec.engine.loop import PREFILL_CHUNK

parser = argparse.ArgumentParser()
parser.add_argument("--model-file")
parser.add_argument("--sizes", default="65,128,256,512,1024,2048,4096")
parser.add_argument("--rounds", type=int, default=5)
args = parser.parse_args()
torch.set_num_threads(2)
ns = argparse.Namespace(
    models="models.yaml", model=None, quant=None, device="cpu", exact=None, model_file=args.model_file
)
session = load_session(ns, pair=resolve_pair(ns))
runner = session.engine.target
assert runner.plan.prefill_attention.value == "kernel", runner.plan.prefill_attention
generator = torch.Generator().manual_seed(0)
sizes = [int(s) for s in args.sizes.split(",")]
prompts = {n: torch.randint(100, 40000, (n,), generator=generator).tolist() for n in sizes}
ms: dict[str, dict[int, list[float]]] = {"kernel": {}, "sdpa": {}}
for round_ in range(args.rounds + 1):
    for path in ms:
        plan.PREFILL_KERNEL_MAX_ROWS = 10**9 if path == "kernel" else 0
        for n, ids in prompts.items():
            runner.reset()
            started = time.perf_counter()
            for start in range(0, n, PREFILL_CHUNK):
                runner.extend(ids[start : start + PREFILL_CHUNK], logits_to_keep=int(start + PREFILL_CHUNK >= n))
            if round_:
                ms[path].setdefault(n, []).append((time.perf_counter() - started) * 1000)
print(f"{runner.plan.summary()}\n")
print("| prompt tokens | layer kernel ms | sdpa ms | kernel tok/s | sdpa tok/s | kernel ÷ sdpa speed |")
print("| ---: | ---: | ---: | ---: | ---: | ---: |")
for n in sizes:
    k, s = statistics.median(ms["kernel"][n]), statistics.median(ms["sdpa"][n])
    print(f"| {n} | {k:.1f} | {s:.1f} | {n / k * 1000:.0f} | {n / s * 1000:.0f} | {s / k:.2f} |")
