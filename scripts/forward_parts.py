"""Where the exact setup's 1-token forward of the embedded model goes, part by part: the whole forward through the
engine's runner, then the same row through the 30 layer-kernel calls alone, the LM head alone, and the embedding,
rotary table and final norm alone (median ms, a 64-token cache); and the Python cost of a q4 kernel call (120 calls
of a 16 × 32 matmul), to take out of figures measured call by call from Python (scripts/kernel_builds.py).

    python scripts/forward_parts.py [--threads 2] [--repeats 80] [--cached 64]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from localspec.models import loading  # noqa: E402
from localspec.models.gguf_linear import q4_kernel_here  # noqa: E402
from localspec.models.registry import parse_registry  # noqa: E402
from localspec.runtime.lean_llama import _rms_norm, backbone_for  # noqa: E402
from localspec.runtime.model_runner import ModelRunner, exact_setup_for  # noqa: E402
from localspec.runtime.q4_kernel import pack_q4  # noqa: E402
from localspec.runtime.q8_head import lm_head_for  # noqa: E402
from tests.test_gguf_linear import random_blocks  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=80)
    parser.add_argument("--cached", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    pair = parse_registry((ROOT / "models.yaml").read_text(), ROOT)[0]
    loaded = loading.load_pair(pair, progress=lambda message: None)
    model = loaded.target
    _, lean = backbone_for(model, None, preallocated=True)
    if not lean.on_layer_kernel:
        print("the layer kernel does not run here (see `localspec generate --json`'s int4_kernel)", file=sys.stderr)
        return 1
    runner = ModelRunner(model, setup=exact_setup_for(model))
    head = lm_head_for(model)
    generator = torch.Generator().manual_seed(0)
    cached = args.cached
    ids = torch.randint(0, model.config.vocab_size, (cached + 1,), generator=generator).tolist()
    runner.reset()
    runner.extend(ids[:cached], logits_to_keep=0)
    token = torch.tensor([[ids[cached]]])
    x = lean.embed(token)  # [1, 1, H]
    cos, sin = lean._rotary(torch.tensor([cached]), cached + 1, x.dtype)
    times: dict[str, list[float]] = {
        "whole 1-token forward (runner.extend)": [],
        "30 layer-kernel calls": [],
        "LM head (q8 kernel)": [],
        "embedding, rotary table, final norm": [],
    }
    names = list(times)
    for round_ in range(-10, args.repeats):
        started = time.perf_counter()
        runner.extend(ids[cached : cached + 1])
        elapsed = [time.perf_counter() - started]
        runner.crop(cached)
        started = time.perf_counter()
        hidden = x
        for layer, cache_layer in zip(lean.layers, runner.cache.layers):
            hidden = layer.layer_kernel.run(hidden, cos, sin, cache_layer, None)
        elapsed.append(time.perf_counter() - started)
        runner.crop(cached)
        started = time.perf_counter()
        head(hidden[0])
        elapsed.append(time.perf_counter() - started)
        started = time.perf_counter()
        embedded = lean.embed(token)
        lean._rotary(torch.tensor([cached]), cached + 1, embedded.dtype)
        _rms_norm(lean.norm, hidden)
        elapsed.append(time.perf_counter() - started)
        if round_ >= 0:
            for name, seconds in zip(names, elapsed):
                times[name].append(seconds)
    kernel = q4_kernel_here().kernel
    _, codes, d, m = random_blocks(16, 32, 1)
    packed, dm = pack_q4(codes, d, m)
    tiny = torch.randn(1, 32).to(torch.bfloat16)
    calls = []
    for _ in range(50):
        started = time.perf_counter()
        for _ in range(120):
            kernel.matmul(tiny, packed, dm, 16)
        calls.append(time.perf_counter() - started)
    print(f"exact setup, {cached} cached positions, {args.threads} threads, median ms of {args.repeats}")
    print("| part | ms |\n|---|---:|")
    for name in names:
        print(f"| {name} | {statistics.median(times[name]) * 1e3:.2f} |")
    overhead = statistics.median(calls) * 1e3
    print(f"| 120 q4 kernel calls of a 16 × 32 matmul from Python (the calls' own cost) | {overhead:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
