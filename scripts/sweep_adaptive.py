"""The adaptive controller's constants (engine/adaptive.py: Tuning) swept on the tuning set: the default setting
(adaptive trees over the entry's proposer) answers every prompt once per variant, variants interleaved prompt by
prompt in a rotating order, each variant with its own controllers kept across its answers as a user's session keeps
them (started from what the load timed, nothing learnt). One constant changes at a time.

  python scripts/sweep_adaptive.py --prompts assets/prompts/tune/*.jsonl --math 2 --limit 2 --repeat 2 --threads 2

Prints, per variant, the median over the repeats of its tok/s ÷ the default constants' tok/s in the same run (with
the spread), overall and on its slowest task type. The evaluation set is never read here (docs/usage.md, "Tuning and
evaluation")."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SWEEP = {  # Tuning field → the values tried besides the default
    "forget": (0.9, 0.98),
    "age": (0.95, 0.995),
    "verify_age": (0.9, 0.99),
    "verify_prior_weight": (2.0, 32.0),
}


def variants():
    from localspec.engine.adaptive import Tuning

    found = {"default": Tuning()}
    for name, values in SWEEP.items():
        for value in values:
            found[f"{name}={value:g}"] = dataclasses.replace(Tuning(), **{name: value})
    return found


def one_run(session, mode, prompts, tunings, max_new_tokens: int) -> dict[str, dict[str, list[float]]]:
    """variant → task type → [tokens, seconds] over the prompts of one interleaved run."""
    from localspec.bench.modes import run_mode
    from localspec.engine.policy import Controllers

    engine = session.engine
    loaded = engine.controllers
    names = list(tunings)
    state = {name: Controllers.retuned(loaded, tunings[name]) for name in names}
    totals: dict[str, dict[str, list[float]]] = {name: {} for name in names}
    try:
        for index, (kind, ids) in enumerate(prompts):
            shift = index % len(names)
            for name in names[shift:] + names[:shift]:
                engine.controllers = state[name]
                result = run_mode(session, mode, ids, max_new_tokens)
                cell = totals[name].setdefault(kind, [0.0, 0.0])
                cell[0] += len(result.token_ids)
                cell[1] += result.seconds
    finally:
        engine.controllers = loaded
    return totals


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", nargs="+", required=True, help="tuning prompt files, one task type each")
    parser.add_argument("--limit", type=int, default=2, help="prompts per file")
    parser.add_argument("--math", type=int, default=2, help="GSM8K training questions (from the end of the file)")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", default=None, help="also write every run's figures here")
    args = parser.parse_args()

    import torch

    from localspec.bench.modes import DEFAULT_ADAPTIVE_MAX_K, DEFAULT_TREE_NODES, Mode
    from localspec.bench.prompts import load_prompt_file
    from localspec.bench.runner import WARMUP_MESSAGES, WARMUP_TOKENS
    from localspec.chat import ChatSession
    from localspec.distill.data import SHARED_DATA
    from localspec.distill.tasks import gsm8k_questions, prompt_messages
    from localspec.models.loading import load_pair
    from localspec.models.registry import find_pair, load_registry

    if args.threads:
        torch.set_num_threads(args.threads)
    for path in args.prompts:
        if "/eval/" in Path(path).resolve().as_posix():
            raise SystemExit(f"{path}: the evaluation set is not for tuning")
    session = ChatSession(load_pair(find_pair(load_registry(REPO / "models.yaml"), None), device="cpu"))
    proposer = session.default_spec().proposer
    mode = Mode("adaptive-tree", DEFAULT_ADAPTIVE_MAX_K, proposer, DEFAULT_TREE_NODES)  # the bench's default mode
    messages = [(p.category, p.messages) for path in args.prompts for p in load_prompt_file(Path(path), args.limit)]
    math = gsm8k_questions(SHARED_DATA)[-args.math :] if args.math else []
    messages += [("math", prompt_messages(question)) for question in math]
    prompts = [(kind, session.prompt_ids(list(m), args.max_new_tokens)[0]) for kind, m in messages]
    tunings = variants()
    warm = [("warm-up", session.prompt_ids(list(m), WARMUP_TOKENS)[0]) for m in WARMUP_MESSAGES]
    one_run(session, mode, warm, tunings, WARMUP_TOKENS)  # never timed; what it learns is thrown away
    runs = []
    for number in range(args.repeat):
        runs.append(one_run(session, mode, prompts, tunings, args.max_new_tokens))
        print(f"run {number + 1} of {args.repeat} done", file=sys.stderr, flush=True)

    def rate(cells: dict[str, list[float]], kind: str | None = None) -> float:
        chosen = [cells[kind]] if kind else list(cells.values())
        return sum(c[0] for c in chosen) / max(sum(c[1] for c in chosen), 1e-9)

    kinds = list(dict.fromkeys(kind for kind, _ in prompts))
    runs_text = f"{args.repeat} interleaved runs, ≤ {args.max_new_tokens} tokens"
    print(f"{mode.label}, {len(prompts)} tuning prompts, {runs_text}")
    print("| variant | tok/s (median) | × default (median, spread) | slowest type × default |")
    print("| --- | ---: | ---: | --- |")
    for name in tunings:
        ratios = [rate(run[name]) / rate(run["default"]) for run in runs]
        by_kind = {k: statistics.median(rate(r[name], k) / rate(r["default"], k) for r in runs) for k in kinds}
        worst = min(by_kind, key=by_kind.get)
        print(
            f"| {name} | {statistics.median(rate(run[name]) for run in runs):.1f} | "
            f"{statistics.median(ratios):.3f} ({min(ratios):.3f}–{max(ratios):.3f}) | {by_kind[worst]:.2f} ({worst}) |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"mode": mode.label, "runs": runs}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
