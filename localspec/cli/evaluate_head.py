"""`localspec evaluate-head`: measure a trained head on the held-out prompts (distill/evaluate.py).

The report: α, mean acceptance length, tokens/s against no proposer (interleaved per prompt), whether greedy output
stayed lossless, and c = head step time / target one-token step time. --top-k instead reports, teacher-forced on the
target's greedy answers, how often the target's token is in the head's top 1-4 per draft step. Exits 1 when the
head's greedy output differs from the target's.
"""

from __future__ import annotations

import json
from pathlib import Path

from localspec.config import DEFAULT_K, ConfigError, check_k

from .common import DEFAULT_MODELS_YAML


def add_parser(sub) -> None:
    parser = sub.add_parser("evaluate-head", help="measure a trained head on the held-out prompts")
    parser.add_argument("--head", required=True, help="the head's folder")
    parser.add_argument("--models", default=str(DEFAULT_MODELS_YAML), help="models.yaml to read (default: %(default)s)")
    parser.add_argument("--model", default=None, help="model pair name from models.yaml (default: the first entry)")
    parser.add_argument("--prompts", type=int, default=24, help="how many held-out prompts (both sets, from the ends)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=DEFAULT_K, help="draft tokens per step")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--json", default=None, help="also write the report here")
    parser.add_argument(
        "--top-k",
        action="store_true",
        help="instead: teacher-forced on the target's greedy answers, how often its token is in the "
        "head's top 1-4 per draft step (the headroom of a token tree over a chain)",
    )


def run(args) -> int:
    import torch

    from localspec.chat import ChatSession
    from localspec.config import SamplingParams, SpecConfig, check_max_new_tokens
    from localspec.distill.data import held_out_prompts
    from localspec.distill.evaluate import TOP_KS, evaluate_head, generate_ids, teacher_forced_top_k
    from localspec.models.loading import load_pair
    from localspec.models.registry import find_pair, load_registry
    from localspec.proposers.head import load_head_proposer

    check_k(args.k, "--k")
    check_max_new_tokens(args.max_new_tokens)
    if args.prompts < 1:
        raise ConfigError(f"--prompts must be ≥ 1 (got {args.prompts})")
    if args.threads:
        torch.set_num_threads(args.threads)
    session = ChatSession(load_pair(find_pair(load_registry(args.models), args.model), device="cpu"))
    prompts = held_out_prompts()
    n = args.prompts
    chosen = prompts if n >= len(prompts) else prompts[: n // 2] + prompts[len(prompts) - (n - n // 2) :]
    if args.top_k:
        head = load_head_proposer(args.head, session.loaded.target, "cpu").head
        sampling = SamplingParams(max_new_tokens=args.max_new_tokens)  # greedy
        rows = []
        for prompt in chosen:
            ids, _ = session.prompt_ids([{"role": "user", "content": prompt}], args.max_new_tokens)
            answer, _, _ = generate_ids(session.engine, ids, sampling, SpecConfig(proposer="none", k=1), None)
            rows.append((ids + answer, len(ids)))
        shares = teacher_forced_top_k(head, session.loaded.target, rows)
        for step, row in enumerate(shares, start=1):
            print(f"draft step {step}: " + "  ".join(f"top-{k} {share:.3f}" for k, share in zip(TOP_KS, row)))
        result, status = {"prompts": len(chosen), "top_k_by_step": shares}, 0
    else:
        report = evaluate_head(
            session,
            chosen,
            lambda: load_head_proposer(args.head, session.loaded.target, "cpu"),
            k=args.k,
            max_new_tokens=args.max_new_tokens,
        )
        result, status = report.to_dict(), 0 if report.lossless else 1
        print(json.dumps(result, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return status
