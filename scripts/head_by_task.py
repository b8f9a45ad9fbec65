"""A head's acceptance length per task type: on prompt files (each file one task type, named by its stem) against
fresh prompts of its training distribution (localspec/distill/tasks.py with another seed, minus every prompt the
training list holds; math: the GSM8K questions training leaves out), greedy, the head alone drafting chains of K.

  python scripts/head_by_task.py --head assets/drafts/smollm2-135m-eagle --head /work/head-v8 \
      --prompts assets/prompts/eval/*.jsonl --limit 4 --train-prompts 4 --threads 2

Prints one markdown row per task type: mean acceptance length (tokens per target forward) on the files, on the
training distribution, and their ratio (issue 26's goal: ≥ 0.8 on every task type)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def acceptance(session, messages, proposer, k: int, max_new_tokens: int) -> tuple[int, int]:
    """(tokens emitted, target forwards) of one greedy answer with the head drafting."""
    from localspec.config import SamplingParams, SpecConfig
    from localspec.distill.evaluate import generate_ids

    ids, _ = session.prompt_ids(list(messages), max_new_tokens)
    sampling = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
    spec = SpecConfig(proposer="head", k=k, adaptive=False)
    _, stats, _ = generate_ids(session.engine, ids, sampling, spec, proposer)
    return stats.emitted, stats.target_forwards


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--head", action="append", required=True, help="a head folder; repeatable")
    parser.add_argument("--prompts", nargs="+", required=True, help="prompt files, one task type each")
    parser.add_argument("--limit", type=int, default=4, help="prompts per file")
    parser.add_argument("--train-prompts", type=int, default=4, help="fresh training-distribution prompts per type")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args()

    import torch

    from localspec.bench.prompts import load_prompt_file
    from localspec.chat import ChatSession
    from localspec.distill.data import SHARED_DATA, training_prompts
    from localspec.distill.tasks import gsm8k_questions, prompt_messages, task_prompts
    from localspec.models.loading import load_pair
    from localspec.models.registry import find_pair, load_registry
    from localspec.proposers.head import load_head_proposer

    if args.threads:
        torch.set_num_threads(args.threads)
    session = ChatSession(load_pair(find_pair(load_registry(REPO / "models.yaml"), None), device="cpu"))
    trained = set(training_prompts(SHARED_DATA))
    fresh = task_prompts(args.train_prompts * 8, SHARED_DATA, seed=1)
    fresh["math"] = gsm8k_questions(SHARED_DATA)  # training takes the first ones: the rest are unseen
    sets: dict[str, dict[str, list]] = {}
    for path in args.prompts:
        for prompt in load_prompt_file(Path(path), args.limit):
            sets.setdefault(prompt.category, {"files": [], "train": []})["files"].append(prompt.messages)
    for kind, prompts in fresh.items():
        if kind in sets:
            unseen = [p for p in prompts if p not in trained]
            sets[kind]["train"] = [prompt_messages(p) for p in unseen[: args.train_prompts]]
    results: dict = {}
    for head in args.head:
        rows = {}
        for kind, groups in sets.items():
            figures = {}
            for name, prompts in groups.items():
                emitted = forwards = 0
                for messages in prompts:
                    proposer = load_head_proposer(head, session.loaded.target, "cpu")
                    e, f = acceptance(session, messages, proposer, args.k, args.max_new_tokens)
                    emitted, forwards = emitted + e, forwards + f
                figures[name] = emitted / max(forwards, 1)
            rows[kind] = figures
            print(f"{head} {kind}: {figures}", file=sys.stderr, flush=True)
        results[head] = rows
    print(f"| task type | {' | '.join(f'{Path(h).name}: files, train, ratio' for h in args.head)} |")
    print("| --- |" + " --- |" * len(args.head))
    for kind in sets:
        cells = []
        for head in args.head:
            f = results[head][kind]
            ratio = f["files"] / f["train"] if f.get("train") else float("nan")
            cells.append(f"{f['files']:.2f}, {f.get('train', float('nan')):.2f}, {ratio:.2f}")
        print(f"| {kind} | " + " | ".join(cells) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
