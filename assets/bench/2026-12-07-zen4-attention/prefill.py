"""Prefill tokens/s of the embedded target on random prompts of 128 to 2,048 tokens (ModelRunner.extend on an empty
cache, the median of three after one warm-up), printed as JSON. Run from a checkout's root, alternating two
checkouts: `PYTHONPATH=. python assets/bench/2026-12-07-zen4-attention/prefill.py`."""

import argparse
import json
import statistics
import time

import torch

from localspec.cli.common import load_session, resolve_pair

torch.set_num_threads(2)
args = argparse.Namespace(models="models.yaml", model=None, quant=None, device="cpu", exact=None, model_file=None)
runner = load_session(args, pair=resolve_pair(args)).engine.target
generator = torch.Generator().manual_seed(0)
speeds = {}
for length in (128, 512, 1024, 2048):
    ids = torch.randint(100, 40000, (length,), generator=generator).tolist()
    seconds = []
    for _ in range(4):
        runner.reset()
        started = time.perf_counter()
        runner.extend(ids, logits_to_keep=1)
        seconds.append(time.perf_counter() - started)
    speeds[length] = round(length / statistics.median(seconds[1:]))
print(json.dumps(speeds))
