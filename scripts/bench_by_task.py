"""Per task type, the median tokens/s of each mode over a `localspec bench --repeat N` output folder's runs, and
the ratios the evaluation goals read (issue: the head's tree against the lookup's, the default against llama.cpp).

Run: python scripts/bench_by_task.py assets/bench/2026-12-02-eval-xeon
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

MODES = {
    "none": "none",
    "ngram-tree N=8": "ngram-tree",
    "ngram+head-tree N=8": "ngram+head-tree",
    "adaptive tree (ngram+head, K≤8, N≤8)": "default",
    "llama.cpp": "llama.cpp",
    "llama.cpp-lookup": "llama.cpp-lookup",
}


def main() -> int:
    folder = Path(sys.argv[1])
    runs = [json.loads(p.read_text())["summary"]["rows"] for p in sorted(folder.glob("run-*/results.json"))]
    labels = [label for label in MODES if all(label in run for run in runs)]
    categories = list(runs[0][labels[0]])

    def median(fn) -> float:
        return statistics.median(fn(run) for run in runs)

    print(f"{len(runs)} runs; medians")
    print(
        "| task type | " + " | ".join(MODES[m] for m in labels) + " | head tree ÷ lookup tree | default ÷ llama.cpp |"
    )
    print("| --- |" + " ---: |" * (len(labels) + 2))
    for cat in categories:
        cells = [f"{median(lambda r, m=m, c=cat: r[m][c]['tokens_per_s']):.1f}" for m in labels]
        head = median(
            lambda r, c=cat: r["ngram+head-tree N=8"][c]["tokens_per_s"] / r["ngram-tree N=8"][c]["tokens_per_s"]
        )
        default = median(
            lambda r, c=cat: (
                r["adaptive tree (ngram+head, K≤8, N≤8)"][c]["tokens_per_s"] / r["llama.cpp"][c]["tokens_per_s"]
            )
        )
        print(f"| {cat} | " + " | ".join(cells) + f" | {head:.2f} | {default:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
