"""Two ways of running the embedded target's forward against each other: bitwise agreement and time per row count.

--compare lean (the default): the lean llama forward against transformers' own. --compare packed: the lean forward
with the LM head (and whatever else PackedLinear takes) on oneDNN's prepacked weights against plain F.linear
(LOCALSPEC_PACKED=off for the first runner). --compare q4: the lean gguf-int4 forward on torch's int4 kernel
(LOCALSPEC_Q4_KERNEL=off) against the q4 kernel (runtime/q4_kernel.py): two models, the same file; their logits
differ (the q4 kernel keeps d and m in float16 and sums in float32), so the bitwise column reads no. --compare layer:
the exact setup's decode / verify forwards with each layer's torch ops around the kernels against the layer kernel
(runtime/layer_kernel.py: one C call a layer); the largest logit difference is printed (its norms and SiLU round
apart from torch's), and the fast setup, which never runs it, is skipped.

For each forward setup (fast, exact) and each T = 1..9: are the second runner's T-token logits bitwise the first's
(on a 64-token cache, after the same prefill), and the median time of each, interleaved forward by forward (the
two runners share one model and weights), with the ratio first / second.

Run: python scripts/lean_forward.py [--compare lean|packed|q4] [--format gguf-int4|bfloat16|float32] [--threads 2]
     [--repeats 30]   (--compare layer: also --compare lean's other flags)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
PREFIX = 64
ROWS = tuple(range(1, 10))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--format", default="gguf-int4", choices=("gguf-int4", "bfloat16", "float32"))
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--compare", default="lean", choices=("lean", "packed", "q4", "layer"))
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from localspec.models.dtype_choice import format_fields
    from localspec.models.loading import load_causal_lm
    from localspec.models.registry import parse_registry
    from localspec.runtime.model_runner import FAST, ModelRunner, exact_setup_for

    pair = parse_registry((REPO / "models.yaml").read_text(encoding="utf-8"), REPO)[0]
    spec = replace(pair.target, **format_fields(args.format))
    model = load_causal_lm(spec, "lean_forward", torch.device("cpu"), "target")[0]
    models = {}
    if args.compare == "q4":
        from localspec.runtime.q4_kernel import load_q4_kernel

        os.environ["LOCALSPEC_Q4_KERNEL"] = "off"
        load_q4_kernel.cache_clear()
        models["torch int4"] = load_causal_lm(spec, "lean_forward", torch.device("cpu"), "target")[0]
        del os.environ["LOCALSPEC_Q4_KERNEL"]
        load_q4_kernel.cache_clear()
        models["q4"] = model
    dtype = model.get_input_embeddings().weight.dtype
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "")
    print(f"{cpu}, {torch.get_num_threads()} threads, load {os.getloadavg()[0]:.1f}, {args.format} ({dtype})")
    prefix = list(range(100, 100 + PREFIX))
    first, second = {
        "lean": ("transformers", "lean"),
        "packed": ("plain head", "packed head"),
        "layer": ("torch-op layers", "layer kernel"),
    }.get(args.compare, ("torch int4", "q4"))
    print(f"| setup | T | bitwise | max logit gap | {first} ms | {second} ms | × |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: |")
    setups = (exact_setup_for(model),) if args.compare == "layer" else (FAST, exact_setup_for(model))
    for setup in setups:
        if args.compare == "layer":
            runners = {first: _WithoutLayerKernel(ModelRunner(model, compile="off", setup=setup, forward="lean"))}
            runners[second] = ModelRunner(model, compile="off", setup=setup, forward="lean")
        elif args.compare == "lean":
            runners = {
                kind: ModelRunner(model, compile="off", setup=setup, forward=kind) for kind in ("transformers", "lean")
            }
        elif args.compare == "q4":
            runners = {kind: ModelRunner(m, compile="off", setup=setup, forward="lean") for kind, m in models.items()}
        else:
            os.environ["LOCALSPEC_PACKED"] = "off"
            runners = {first: ModelRunner(model, compile="off", setup=setup, forward="lean")}
            os.environ["LOCALSPEC_PACKED"] = "on"
            runners[second] = ModelRunner(model, compile="off", setup=setup, forward="lean")
        for runner in runners.values():
            runner.reset()
            runner.extend(prefix, logits_to_keep=0)
        for rows in ROWS:
            chunk = list(range(300, 300 + rows))
            logits = {}
            for kind, runner in runners.items():
                logits[kind] = runner.extend(chunk).logits
                runner.crop(PREFIX)
            times = {kind: [] for kind in runners}
            for _ in range(args.repeats):
                for kind, runner in runners.items():
                    start = time.perf_counter()
                    runner.extend(chunk)
                    times[kind].append(time.perf_counter() - start)
                    runner.crop(PREFIX)
            a, b = (statistics.median(times[kind]) * 1e3 for kind in (first, second))
            same = torch.equal(logits[first], logits[second])
            gap = float((logits[first].float() - logits[second].float()).abs().max())
            yes = "yes" if same else "no"
            print(f"| {setup.name} | {rows} | {yes} | {gap:.3f} | {a:.1f} | {b:.1f} | {a / b:.2f} |")
    return 0


class _WithoutLayerKernel:
    """A runner whose forwards run each layer's torch ops (the layer kernel unbound for their duration)."""

    def __init__(self, runner) -> None:
        self.runner = runner

    def _layers(self):
        from localspec.runtime.lean_llama import backbone_for

        return backbone_for(self.runner.model, "lean", preallocated=True)[1].layers

    def extend(self, ids, **kwargs):
        bound = [layer.layer_kernel for layer in self._layers()]
        for layer in self._layers():
            layer.layer_kernel = None
        try:
            return self.runner.extend(ids, **kwargs)
        finally:
            for layer, kernel in zip(self._layers(), bound, strict=True):
                layer.layer_kernel = kernel

    def reset(self) -> None:
        self.runner.reset()

    def crop(self, length: int) -> None:
        self.runner.crop(length)


if __name__ == "__main__":
    raise SystemExit(main())
