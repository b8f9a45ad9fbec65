"""Per task type, the median tokens/s of each mode over a `localspec bench --repeat N` output folder's runs, and
the ratios the evaluation goals read (issue: the head's tree against the lookup's, the default against llama.cpp).

A second table takes the head tree ÷ lookup tree ratio apart, from the same runs' per prompt records (all runs
pooled): tokens per step (new tokens ÷ target forwards: what a step emits) and milliseconds per step (the head's
drafting plus a verify forward over its tree, against the lookup's), so speed ratio = tokens ratio ÷ step-time
ratio. The head's tree wins where its extra tokens per step outweigh what its step costs more.

Run: python scripts/bench_by_task.py assets/bench/2026-12-02-eval-xeon
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

LOOKUP_TREE, HEAD_TREE = "ngram-tree N=8", "ngram+head-tree N=8"
MODES = {
    "none": "none",
    "ngram-tree N=8": "ngram-tree",
    "ngram+head-tree N=8": "ngram+head-tree",
    "adaptive tree (ngram+head, K≤8, N≤8)": "default",
    "llama.cpp": "llama.cpp",
    "llama.cpp-lookup": "llama.cpp-lookup",
}


DEFAULT = "adaptive tree (ngram+head, K≤8, N≤8)"
RATIOS = (("head tree ÷ lookup tree", HEAD_TREE, LOOKUP_TREE), ("default ÷ llama.cpp", DEFAULT, "llama.cpp"))


def main() -> int:
    folder = Path(sys.argv[1])
    runs = [json.loads(p.read_text())["summary"]["rows"] for p in sorted(folder.glob("run-*/results.json"))]
    labels = [label for label in MODES if all(label in run for run in runs)]
    ratios = [ratio for ratio in RATIOS if {ratio[1], ratio[2]} <= set(labels)]  # those the runs have both modes of
    categories = list(runs[0][labels[0]])

    def median(fn) -> float:
        return statistics.median(fn(run) for run in runs)

    print(f"{len(runs)} runs; medians")
    print("| task type | " + " | ".join([MODES[m] for m in labels] + [name for name, _, _ in ratios]) + " |")
    print("| --- |" + " ---: |" * (len(labels) + len(ratios)))
    for cat in categories:
        cells = [f"{median(lambda r, m=m, c=cat: r[m][c]['tokens_per_s']):.1f}" for m in labels]
        cells += [
            f"{median(lambda r, c=cat, a=a, b=b: r[a][c]['tokens_per_s'] / r[b][c]['tokens_per_s']):.2f}"
            for _, a, b in ratios
        ]
        print(f"| {cat} | " + " | ".join(cells) + " |")
    print()
    step_table(folder)
    return 0


def step_table(folder: Path) -> None:
    """Tokens per step and ms per step of `none`, the lookup tree and the head tree, per task type (runs pooled)."""
    totals: dict[str, dict[str, list[float]]] = {}  # category → mode → [new tokens, target forwards, seconds]
    for path in sorted(folder.glob("run-*/results.json")):
        for prompt in json.loads(path.read_text())["prompts"]:
            for mode in ("none", LOOKUP_TREE, HEAD_TREE):
                record = prompt["results"].get(mode)
                if record is None or not record.get("target_forwards"):
                    continue
                for category in (prompt["category"], "all"):
                    cell = totals.setdefault(category, {}).setdefault(mode, [0.0, 0.0, 0.0])
                    cell[0] += record["new_tokens"]
                    cell[1] += record["target_forwards"]
                    cell[2] += record["seconds"]
    print("per step, runs pooled: tokens per step (new tokens ÷ target forwards) and ms per step (seconds ÷ target")
    print("forwards, prefill included, so the long-prompt types read higher)")
    print(
        "| task type | `none` ms/step | lookup tree tokens/step | head tree tokens/step | tokens × | lookup tree "
        "ms/step | head tree ms/step | step time × | speed × (tokens × ÷ step time ×) |"
    )
    print("| --- |" + " ---: |" * 8)
    for category, modes in sorted(totals.items(), key=lambda item: item[0] == "all"):
        if not all(mode in modes for mode in ("none", LOOKUP_TREE, HEAD_TREE)):
            continue
        (nt, nf, ns), (lt, lf, ls), (ht, hf, hs) = (modes[m] for m in ("none", LOOKUP_TREE, HEAD_TREE))
        tokens, time = (ht / hf) / (lt / lf), (hs / hf) / (ls / lf)
        print(
            f"| {category} | {ns / nf * 1e3:.1f} | {lt / lf:.2f} | {ht / hf:.2f} | {tokens:.2f} | "
            f"{ls / lf * 1e3:.1f} | {hs / hf * 1e3:.1f} | {time:.2f} | {tokens / time:.2f} |"
        )


if __name__ == "__main__":
    raise SystemExit(main())
