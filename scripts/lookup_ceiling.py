"""How much a prompt lookup can gain on the embedded model's own answers: replay its greedy answers and count the
tokens per target forward each lookup would emit (the target's answer is fixed, so no forward is needed).

  python scripts/lookup_ceiling.py [--limit 12] [--max-new-tokens 128] [--ids answers.json]

Rows: transformers' prompt lookup (2-gram to 1-gram, the earliest occurrence, K tokens), ours as a chain (the most
recent occurrence of the longest suffix, 4-gram to 1-gram), ours as a trie of every recent occurrence (N nodes:
tokens per forward where the longest accepted branch counts), and the ceiling: at each step the best continuation of
any earlier occurrence of any suffix (1 to 8 tokens long), which no lookup can beat. The greedy answers are made
once with plain decoding (`--ids` reuses a file of them).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from localspec.proposers.ngram import continuation_tree, find_continuation, occurrences  # noqa: E402


def transformers_pld(context: np.ndarray, k: int) -> list[list[int]]:
    for n in range(min(2, len(context) - 1), 0, -1):
        hits = occurrences(context, n)
        if hits.size:
            return [context[hits[0] + n : hits[0] + n + k].tolist()]
    return []


def ours_chain(context: np.ndarray, k: int) -> list[list[int]]:
    found = find_continuation(context, k, 1, 4)
    return [found] if found else []


def ours_tree(context: np.ndarray, n_nodes: int) -> list[list[int]]:
    tree = continuation_tree(context, n_nodes, 1, 4)
    if tree is None:
        return []
    leaves = [i for i in range(tree.size) if not tree.children[i + 1]]
    return [[tree.token_ids[a] for a in tree.ancestors(leaf)] for leaf in leaves]


def accepted(branches: list[list[int]], answer: list[int], at: int) -> int:
    best = 0
    for branch in branches:
        n = 0
        while n < len(branch) and at + n < len(answer) and branch[n] == answer[at + n]:
            n += 1
        best = max(best, n)
    return best


def ceiling_accepted(context: np.ndarray, answer: list[int], at: int) -> int:
    best = 0
    for n in range(1, 9):
        for start in occurrences(context, n):
            m = 0
            while at + m < len(answer) and start + n + m < len(context) and context[start + n + m] == answer[at + m]:
                m += 1
            best = max(best, m)
    return best


def tokens_per_forward(rows: list[dict], propose) -> float:
    tokens = forwards = 0
    for row in rows:
        prompt, answer, at = row["prompt"], row["answer"], 0
        while at < len(answer):
            context = np.asarray(prompt + answer[:at], dtype=np.int64)
            at += propose(context, answer, at) + 1
            forwards += 1
        tokens += len(answer)
    return tokens / forwards


def make_answers(limit: int, max_new_tokens: int) -> list[dict]:
    from localspec.bench.prompts import load_prompts
    from localspec.chat import ChatSession
    from localspec.config import SamplingParams, SpecConfig
    from localspec.models.loading import load_pair
    from localspec.models.registry import load_registry

    session = ChatSession(load_pair(load_registry(Path("models.yaml"))[0], device="cpu", load_draft=False))
    rows = []
    for prompt in load_prompts(limit=limit):
        ids, _ = session.prompt_ids(list(prompt.messages), max_new_tokens)
        events = session.engine.generate(ids, SamplingParams(max_new_tokens=max_new_tokens), SpecConfig("none"))
        rows.append({"id": prompt.prompt_id, "prompt": ids, "answer": [t.token_id for e in events for t in e.tokens]})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=12, help="prompts from each set (default 12)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--ids", help="a JSON file of answers to reuse (written here when it does not exist)")
    args = parser.parse_args()
    path = Path(args.ids) if args.ids else None
    rows = json.loads(path.read_text()) if path and path.exists() else make_answers(args.limit, args.max_new_tokens)
    if path and not path.exists():
        path.write_text(json.dumps(rows))
    results = {
        "transformers prompt lookup, K=4": lambda c, a, i: accepted(transformers_pld(c, 4), a, i),
        "ours, chain K=4": lambda c, a, i: accepted(ours_chain(c, 4), a, i),
        "ours, trie N=8": lambda c, a, i: accepted(ours_tree(c, 8), a, i),
        "ceiling (best earlier occurrence)": ceiling_accepted,
    }
    print(f"{len(rows)} answers, {sum(len(r['answer']) for r in rows)} tokens")
    for name, propose in results.items():
        print(f"{name:36s} {tokens_per_forward(rows, propose):.3f} tokens per target forward")


if __name__ == "__main__":
    main()
