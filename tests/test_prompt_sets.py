"""The tuning and evaluation prompt sets: every task type in both, no prompt in both, and the evaluation set read by
nothing but the benchmark command a person runs (assets/prompts/README.md states the rule)."""

from __future__ import annotations

import json
from pathlib import Path

from localspec.bench.prompts import load_prompt_file

REPO = Path(__file__).resolve().parents[1]
SETS = REPO / "assets" / "prompts"


def texts(folder: str) -> dict[str, set[str]]:
    out = {}
    for path in sorted((SETS / folder).glob("*.jsonl")):
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        out[path.stem] = {json.dumps(r["messages"], sort_keys=True) for r in rows}
    return out


def test_both_sets_cover_the_task_types_and_share_no_prompt():
    evaluation, tuning = texts("eval"), texts("tune")
    assert set(evaluation) >= {
        "translation",
        "summarization",
        "factual-qa",
        "math",
        "document-qa",
        "extraction",
        "chat",
        "multi-turn",
    }
    assert set(tuning) | {"math"} >= set(evaluation)  # math tunes on ../shared/data/gsm8k_train_400.jsonl
    shared = set().union(*evaluation.values()) & set().union(*tuning.values())
    assert shared == set()


def test_each_file_loads_as_a_bench_prompt_set():
    for path in sorted(SETS.glob("*/*.jsonl")):
        prompts = load_prompt_file(path)
        assert prompts and all(p.category == path.stem for p in prompts)
        assert all(p.messages[-1]["role"] == "user" for p in prompts)


def test_no_code_reads_the_evaluation_set():
    readers = [
        str(p.relative_to(REPO))
        for p in (REPO / "localspec").rglob("*.py")
        if "prompts/eval" in p.read_text(encoding="utf-8")
    ]
    assert readers == []
