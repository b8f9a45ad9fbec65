"""`localspec bench-sampler`: median µs per call of the torch reference sampler and the fused Triton kernel.

Each configuration (V, K, B, mode) times the two samplers on the same random inputs in the same run and prints their
ratio (reference time / fused time: above 1 means the kernel is faster). The draws are made beforehand, outside the
timing, as the engine makes them. On CUDA every call is timed alone with CUDA events (the queue drained before it),
so launch gaps count. Without CUDA, Triton runs only in its interpreter, which is no speed measurement: the fused
column is left empty unless --include-interpreter asks for it (then with few repeats).
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable

import torch

from localspec.verify import rejection_sample, triton_available
from localspec.verify.checks import make_verify_case

DEFAULT_VOCABS = (32000, 49152, 151936)
DEFAULT_KS = (4, 8)
DEFAULT_BATCHES = (1, 8)
NO_CUDA_NOTE = (
    "no CUDA here: the fused kernel can only run in Triton's interpreter, which measures nothing about "
    "speed, so only the torch reference is timed (--include-interpreter times the interpreter anyway)"
)


def add_parser(sub) -> None:
    parser = sub.add_parser("bench-sampler", help="time the torch reference sampler against the fused Triton kernel")
    parser.add_argument("--vocab", type=int, nargs="+", default=list(DEFAULT_VOCABS), help="V values")
    parser.add_argument("--k", type=int, nargs="+", default=list(DEFAULT_KS), help="K values")
    parser.add_argument("--batch", type=int, nargs="+", default=list(DEFAULT_BATCHES), help="B values")
    parser.add_argument(
        "--mode",
        choices=("greedy", "stochastic", "both"),
        default="both",
        help="greedy (temperature 0) or stochastic (T=1, draft-model probabilities)",
    )
    parser.add_argument(
        "--repeats", type=int, default=None, help="timed calls per sampler (default 100 on CUDA, 5 on CPU)"
    )
    parser.add_argument("--warmup", type=int, default=None, help="untimed calls first (default 10 on CUDA, 1 on CPU)")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    parser.add_argument(
        "--include-interpreter",
        action="store_true",
        help="without CUDA, time the fused kernel in Triton's interpreter too (2 repeats)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")


def _time_calls(fn: Callable[[], object], repeats: int, warmup: int, device: torch.device) -> float:
    """Median µs per call."""
    for _ in range(warmup):
        fn()
    times = []
    if device.type == "cuda":
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize(device)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1000.0)
    else:
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def run_bench(args) -> dict:
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cuda = device.type == "cuda"
    repeats = args.repeats or (100 if cuda else 5)
    warmup = args.warmup if args.warmup is not None else (10 if cuda else 1)
    fused, fused_mode, note = None, "not run", ""
    if not triton_available():
        note = "triton is not installed: only the torch reference is timed"
    else:
        from localspec.verify import triton_fused

        if cuda and not triton_fused.INTERPRETED:
            fused, fused_mode = triton_fused.fused_rejection_sample, "compiled"
        elif not cuda and triton_fused.INTERPRETED and args.include_interpreter:
            fused, fused_mode = triton_fused.fused_rejection_sample, "interpreter"
            note = "fused times are Triton's interpreter on the CPU: a functional run, not a speed measurement"
        elif triton_fused.INTERPRETED:
            note = NO_CUDA_NOTE
        else:
            note = f"the compiled fused kernel runs on CUDA tensors only, not {device.type}: use --device cuda"
    fused_repeats = min(repeats, 2) if fused_mode == "interpreter" else repeats
    fused_warmup = 0 if fused_mode == "interpreter" else warmup
    modes = ("greedy", "stochastic") if args.mode == "both" else (args.mode,)
    rows = []
    for vocab in args.vocab:
        for k in args.k:
            for batch in args.batch:
                for mode in modes:
                    case = make_verify_case(
                        0,
                        batch,
                        k,
                        vocab,
                        temperature=0.0 if mode == "greedy" else 1.0,
                        with_draft_probs=True,
                        device=device,
                    )
                    torch_us = _time_calls(lambda case=case: case.run(rejection_sample), repeats, warmup, device)
                    fused_us = None
                    if fused is not None:
                        fused_us = _time_calls(lambda case=case: case.run(fused), fused_repeats, fused_warmup, device)
                    rows.append(
                        {
                            "vocab": vocab,
                            "k": k,
                            "batch": batch,
                            "mode": mode,
                            "torch_us": round(torch_us, 2),
                            "fused_us": None if fused_us is None else round(fused_us, 2),
                            "speedup": None if fused_us is None else round(torch_us / fused_us, 3),
                        }
                    )
    return {"device": str(device), "fused": fused_mode, "repeats": repeats, "note": note, "rows": rows}


def run(args) -> int:
    result = run_bench(args)
    if args.json:
        print(json.dumps(result))
        return 0
    print(
        f"bench-sampler: device {result['device']}, fused kernel {result['fused']}, "
        f"median of {result['repeats']} calls; speedup = torch µs / fused µs"
    )
    if result["note"]:
        print(f"note: {result['note']}")
    print(f"{'V':>7} {'K':>2} {'B':>2} {'mode':<10} {'torch µs':>10} {'fused µs':>10} {'speedup':>8}")
    for row in result["rows"]:
        fused = "—" if row["fused_us"] is None else f"{row['fused_us']:.1f}"
        speedup = "—" if row["speedup"] is None else f"{row['speedup']:.2f}x"
        print(
            f"{row['vocab']:>7} {row['k']:>2} {row['batch']:>2} {row['mode']:<10} {row['torch_us']:>10.1f} "
            f"{fused:>10} {speedup:>8}"
        )
    return 0
