"""The history proposers where a chat user meets them, against plain decoding and the n-gram lookup.

Scenarios, each on prompts that shaped nothing in proposers/history.py (its constants were set before any run):
  regenerate  a first-turn prompt answered once (greedy), then answered again with that answer as the first
              source and in the history, as Regenerate does in the chat window;
  second-turn MT-Bench's second turns, after the model's own first answer (which the store keeps, so it is in the
              history as well as in the context);
  code-edit   a HumanEval function, then "the same function, but …";
  first-chat  a first conversation with an empty history: history+head against the default setting (ngram+head,
              adaptive trees), both with the entry's K and tree nodes.
Every mode of a scenario answers the same prompt ids, greedy, interleaved prompt by prompt (the order rotates);
greedy outputs are compared with the baseline's (plain decoding; in first-chat, the default setting). Prints tok/s
per mode and the ratios, as one markdown table.

    python scripts/bench_history.py [--limit 6] [--max-new-tokens 128] [--threads 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
MT_BENCH_IDS = (81, 91, 101, 111, 121, 131, 141, 85, 95, 105)  # one per category first, then a second round
HUMANEVAL_IDS = (10, 30, 50, 70, 90, 110, 130, 20)
EDIT_TURN = "Now write the same function again, but with type hints and a docstring. Reply with the whole function."


@dataclass(frozen=True)
class Case:
    scenario: str
    prompt_id: str
    messages: tuple[dict, ...]  # the conversation whose last user message is timed
    first_answer_of: tuple[dict, ...] = ()  # the turn answered first (untimed) and kept as history / context


def cases(limit: int) -> list[Case]:
    rows = {}
    with open(DATA / "mt_bench_question.jsonl") as fh:
        for line in fh:
            row = json.loads(line)
            rows[row["question_id"]] = row["turns"]
    with gzip.open(DATA / "HumanEval.jsonl.gz", "rt") as fh:
        code = {int(json.loads(line)["task_id"].split("/")[1]): json.loads(line)["prompt"] for line in fh}
    out: list[Case] = []
    for qid in MT_BENCH_IDS[:limit]:
        first = ({"role": "user", "content": rows[qid][0]},)
        out.append(Case("regenerate", f"mt{qid}", first, first))
        out.append(Case("second-turn", f"mt{qid}", first + ({"role": "user", "content": rows[qid][1]},), first))
        out.append(Case("first-chat", f"mt{qid}", first))
    for tid in HUMANEVAL_IDS[:limit]:
        ask = "Complete this Python function. Reply with the whole function in one code block.\n\n" + code[tid]
        first = ({"role": "user", "content": ask},)
        out.append(Case("code-edit", f"he{tid}", first + ({"role": "user", "content": EDIT_TURN},), first))
    return out


def modes_for(scenario: str) -> list[tuple[str, dict]]:
    if scenario == "first-chat":
        return [
            ("ngram+head adaptive tree (default)", {"proposer": "ngram+head"}),
            ("history+head adaptive tree", {"proposer": "history+head"}),
        ]
    plain = {"adaptive": False}
    return [
        ("none", {"proposer": "none", **plain}),
        ("ngram K=4", {"proposer": "ngram", "k": 4, "tree_nodes": 0, **plain}),
        ("ngram-tree N=8", {"proposer": "ngram", "tree_nodes": 8, **plain}),
        ("history K=4", {"proposer": "history", "k": 4, "tree_nodes": 0, **plain}),
        ("history-tree N=8", {"proposer": "history", "tree_nodes": 8, **plain}),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=6, help="prompts per prompt set")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    torch.set_num_threads(args.threads)
    from localspec.chat import ChatSession
    from localspec.config import SamplingParams
    from localspec.models.loading import load_pair
    from localspec.models.registry import load_registry
    from localspec.proposers.history import SuffixIndex

    session = ChatSession(load_pair(load_registry(REPO / "models.yaml")[0]))
    sampling = SamplingParams(max_new_tokens=args.max_new_tokens)

    def answer(ids, spec, first_source=()):
        proposer = session.make_proposer(spec, first_source=first_source)
        started = time.perf_counter()
        out, forwards = [], 0
        for event in session.engine.generate(ids, sampling, spec, proposer):
            out.extend(t.token_id for t in event.tokens)
            forwards += 1
        return out, time.perf_counter() - started, forwards

    warm = session.prompt_ids([{"role": "user", "content": "Say hello in five words."}], 32)[0]
    for _name, overrides in modes_for("regenerate") + modes_for("first-chat"):
        answer(warm, session.default_spec(**overrides))  # untimed: caches, controllers' first measurements

    history = SuffixIndex()  # grows like the store's: every first answer, as the app would save it
    rows: dict[tuple[str, str], list[tuple[float, float, bool]]] = {}  # (scenario, mode) → (tok/s, forwards, same)
    for n, case in enumerate(cases(args.limit)):
        first_ids: list[int] = []
        if case.first_answer_of:
            ids = session.prompt_ids(list(case.first_answer_of), args.max_new_tokens)[0]
            first_ids, _s, _f = answer(ids, session.default_spec(proposer="none"))
            text = session.tokenizer.decode(first_ids, skip_special_tokens=True)
        messages = list(case.messages)
        if case.scenario in ("second-turn", "code-edit"):
            messages = [messages[0], {"role": "assistant", "content": text}, messages[1]]
        session.history = SuffixIndex() if case.scenario == "first-chat" else history
        ids = session.prompt_ids(messages, args.max_new_tokens)[0]
        modes = modes_for(case.scenario)
        modes = modes[n % len(modes) :] + modes[: n % len(modes)]  # interleaved, the order rotating
        results = {}
        for name, overrides in modes:
            first_source = first_ids if case.scenario == "regenerate" and "history" in name else ()
            results[name] = answer(ids, session.default_spec(**overrides), first_source)
        reference = results[modes_for(case.scenario)[0][0]][0]  # plain decoding; first-chat: the default
        for name, (out, seconds, forwards) in results.items():
            rows.setdefault((case.scenario, name), []).append(
                (len(out) / seconds, len(out) / forwards, out == reference)
            )
        if first_ids:
            history.add(f"{case.prompt_id}-first", first_ids)
        print(
            f"{case.scenario} {case.prompt_id}: "
            + ", ".join(f"{k} {len(v[0]) / v[1]:.1f}" for k, v in results.items()),
            file=sys.stderr,
            flush=True,
        )

    print(
        f"\nhistory bench: {torch.get_num_threads()} threads, ≤ {args.max_new_tokens} new tokens, greedy, "
        f"load {os.getloadavg()[0]:.1f}, {time.strftime('%Y-%m-%d %H:%M')}\n"
    )
    print(
        "| scenario | mode | prompts | tok/s (median) | × baseline | × ngram K=4 | tokens per forward "
        "| same as baseline |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    table = []
    for (scenario, name), values in rows.items():
        rate = statistics.median(v[0] for v in values)
        base = rows.get((scenario, modes_for(scenario)[0][0]))  # none; first-chat: the default setting
        ngram = rows.get((scenario, "ngram K=4"))

        def ratio(other, values=values):
            if not other:
                return "–"
            return f"{statistics.median(a[0] / b[0] for a, b in zip(values, other)):.2f}"

        per_forward = statistics.mean(v[1] for v in values)
        same = sum(v[2] for v in values)
        print(
            f"| {scenario} | {name} | {len(values)} | {rate:.1f} | {ratio(base)} | {ratio(ngram)} | "
            f"{per_forward:.2f} | {same}/{len(values)} |"
        )
        table.append(
            {
                "scenario": scenario,
                "mode": name,
                "tok_s": rate,
                "per_forward": per_forward,
                "same": same,
                "n": len(values),
            }
        )
    if args.json:
        args.json.write_text(json.dumps(table, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
