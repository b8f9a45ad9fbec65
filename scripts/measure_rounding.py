"""Measure how far a verify forward (K+1 tokens at once) and plain decoding (1 token per forward) of the same target
differ in logits at the same positions, per compute path, over real prompts from ../shared/data.

For each prompt the target decodes NEW_TOKENS greedy tokens one forward per token (the engine's plain path: the
prompt minus its last token prefilled, then 1-token forwards). The same sequence is then fed again on a fresh cache in
chunks of K+1 tokens (the engine's verify forward with every draft accepted, so each row has the same prefix as the
plain row it is compared with, and the cache is built by chunk forwards as in a speculative run). Per path it prints:

  max |Δlogit|   the largest absolute logit difference between the two at any compared position and token;
  flips          positions where the argmax differs, and the largest top-2 gap (on the plain path's logits) among them;
  flip bound     2 × max |Δlogit|: a flip at a position needs the top-2 gap g of the plain logits to be overturned,
                 so g ≤ |Δ top-1| + |Δ top-2| ≤ 2 × max |Δlogit|. Below it a flip is a rounding near-tie.

Run: python scripts/measure_rounding.py [--paths float32,bfloat16,float16,nf4,int8,gguf] [--json out.json]
The numbers go into localspec/verify/guarantee.py (MEASURED) and the README's per-path table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

NEW_TOKENS = 32
CHUNKS = (2, 4, 6, 9)  # K + 1 for K = 1, 3, 5, 8 (the lossless tests' Ks)
PATHS = {
    "float32": ("float32", "none"),
    "bfloat16": ("bfloat16", "none"),
    "float16": ("float16", "none"),
    "nf4": ("float32", "nf4"),
    "int8": ("float32", "int8"),
    "gguf": ("bfloat16", "gguf"),  # the GGUF's Q4_1 blocks as int4 linears (models/gguf_linear.py)
}


def cpu_name() -> str:
    try:
        out = subprocess.run(["lscpu"], check=False, capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return platform.processor() or platform.machine()
    return next(
        (line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")),
        platform.machine(),
    )


def top2_gap(logits: torch.Tensor) -> float:
    top = torch.topk(logits.float(), 2).values
    return float(top[0] - top[1])


def plain_logits(runner, prompt_ids: list[int], new_tokens: int, stop: set[int]) -> tuple[list[int], torch.Tensor]:
    """Greedy decode with 1-token forwards; return (the fed sequence [prompt[-1]] + answer, logits [T, V])."""
    runner.reset()
    runner.extend(prompt_ids[:-1], logits_to_keep=0)
    fed, rows = [prompt_ids[-1]], []
    for _ in range(new_tokens):
        logits = runner.extend([fed[-1]], logits_to_keep=1).logits[-1].float()
        rows.append(logits)
        token = int(torch.argmax(logits))
        if token in stop:
            break
        fed.append(token)
    return fed[: len(rows)], torch.stack(rows)


def chunked_logits(runner, prompt_ids: list[int], fed: list[int], chunk: int) -> torch.Tensor:
    runner.reset()
    runner.extend(prompt_ids[:-1], logits_to_keep=0)
    rows = [runner.extend(fed[i : i + chunk]).logits.float() for i in range(0, len(fed), chunk)]
    return torch.cat(rows)


def measure_path(name: str, prompts: list[str]) -> dict:
    from localspec.chat import ChatSession
    from localspec.config import ModelSpec
    from localspec.models.loading import load_pair
    from localspec.models.registry import load_registry
    from localspec.runtime.model_runner import ModelRunner

    dtype, quant = PATHS[name]
    pair = load_registry(REPO / "models.yaml")[0]
    target = ModelSpec(pair.target.source, quant, dtype, pair.target.trust_remote_code)
    pair = dataclasses.replace(pair, target=target)
    started = time.perf_counter()
    session = ChatSession(load_pair(pair, device="cpu", load_draft=False))
    runner = ModelRunner(session.loaded.target)
    stop = set(session.engine.stop_token_ids)
    max_diff, positions, flips, max_flip_gap, min_gap = 0.0, 0, 0, 0.0, float("inf")
    per_chunk = {}
    for text in prompts:
        prompt_ids = session.prompt_ids([{"role": "user", "content": text}], NEW_TOKENS)[0]
        fed, plain = plain_logits(runner, prompt_ids, NEW_TOKENS, stop)
        gaps = [top2_gap(row) for row in plain]
        min_gap = min(min_gap, *gaps)
        for chunk in CHUNKS:
            verify = chunked_logits(runner, prompt_ids, fed, chunk)
            diff = float((verify - plain).abs().max())
            max_diff = max(max_diff, diff)
            stats = per_chunk.setdefault(chunk, {"max_abs_diff": 0.0, "flips": 0})
            stats["max_abs_diff"] = max(stats["max_abs_diff"], diff)
            flipped = (verify.argmax(-1) != plain.argmax(-1)).nonzero().flatten().tolist()
            positions += len(fed)
            flips += len(flipped)
            stats["flips"] += len(flipped)
            for j in flipped:
                max_flip_gap = max(max_flip_gap, gaps[j])
    return {
        "path": name,
        "dtype": dtype,
        "quant": quant,
        "prompts": len(prompts),
        "positions": positions,
        "max_abs_diff": max_diff,
        "flips": flips,
        "max_flip_gap": max_flip_gap,
        "flip_bound": 2 * max_diff,
        "smallest_top2_gap": min_gap,
        "per_chunk": per_chunk,
        "seconds": time.perf_counter() - started,
    }


def main(argv: list[str] | None = None) -> int:
    from conftest import shared_prompts

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--paths", default=",".join(PATHS), help="comma-separated: " + ", ".join(PATHS))
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--mt-bench", type=int, default=6, help="MT-Bench prompts (default: %(default)s)")
    parser.add_argument("--humaneval", type=int, default=4, help="HumanEval prompts (default: %(default)s)")
    args = parser.parse_args(argv)
    prompts = shared_prompts(limit_mt=args.mt_bench, limit_code=args.humaneval)
    machine = f"{cpu_name()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}"
    print(
        f"# rounding: 1-token vs (K+1)-token forwards, K+1 in {CHUNKS}, {len(prompts)} prompts × {NEW_TOKENS} "
        f"tokens, SmolLM2-135M-Instruct on CPU ({machine})"
    )
    print("| path | max abs logit diff | flips / positions | largest flip gap | flip bound (2 × max diff) |")
    print("|---|---:|---:|---:|---:|")
    results = []
    for name in args.paths.split(","):
        try:
            result = measure_path(name, prompts)
        except Exception as exc:  # one path that does not run here must not hide the others
            result = {"path": name, "error": f"{type(exc).__name__}: {exc}"}
            print(f"| {name} | does not run: {result['error'][:80]} | | | |", flush=True)
        else:
            print(
                f"| {name} | {result['max_abs_diff']:.3g} | {result['flips']} / {result['positions']} | "
                f"{result['max_flip_gap']:.3g} | {result['flip_bound']:.3g} |",
                flush=True,
            )
        results.append(result)
    if args.json:
        args.json.write_text(
            json.dumps({"machine": machine, "new_tokens": NEW_TOKENS, "chunks": CHUNKS, "results": results}, indent=1)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
