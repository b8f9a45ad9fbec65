"""`localspec bench` end to end on the tiny random pair with two prompts: JSON, table and plots (never timings)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from localspec.bench.prompts import (
    load_humaneval,
    load_mt_bench,
    load_prompt_file,
    load_prompts,
)
from localspec.config import ConfigError, SamplingParams

from .conftest import SHARED_DATA


def test_default_prompts_cover_both_sets_and_spread_mt_bench_categories():
    prompts = load_prompts(limit=8)
    assert [p.category for p in prompts] == ["mt-bench"] * 8 + ["humaneval"] * 8
    assert len({p.subcategory for p in prompts[:8]}) == 8  # one per MT-Bench category, not 8 writing prompts
    assert "def " in prompts[-1].messages[0]["content"]
    assert len({p.prompt_id for p in prompts}) == 16


def test_held_out_prompts_are_the_ones_distillation_never_sees():
    from localspec.distill.data import held_out_prompts, training_prompts

    prompts = load_prompts(limit=20, held_out=True)
    ids = [p.prompt_id for p in prompts]
    assert ids[:10] == [f"mt-bench/{n}" for n in range(151, 161)]
    assert ids[10:] == [f"humaneval/{n}" for n in range(150, 164)]
    held = held_out_prompts(SHARED_DATA)
    trained = training_prompts(SHARED_DATA)
    for (
        prompt
    ) in prompts:  # each is one of distill's held-out prompts (same question text) and none of its training ones
        text = prompt.messages[0]["content"]
        question = text.split("```python\n")[-1].removesuffix("```") if prompt.category == "humaneval" else text
        assert any(h.endswith(question) for h in held)
        assert not any(isinstance(t, str) and t.endswith(question) for t in trained)
    assert len(load_prompts(limit=3, held_out=True)) == 6
    with pytest.raises(ConfigError, match="held-out"):
        load_prompts(["x.txt"], held_out=True)


def test_prompt_files_and_their_errors(tmp_path):
    (tmp_path / "mine.txt").write_text("first question\n\nsecond question\n")
    prompts = load_prompt_file(tmp_path / "mine.txt")
    assert [p.messages[0]["content"] for p in prompts] == ["first question", "second question"]
    assert {p.category for p in prompts} == {"mine"}
    (tmp_path / "bad.jsonl").write_text('{"prompt": "ok"}\nnot json\n')
    with pytest.raises(ConfigError, match="line 2"):
        load_prompt_file(tmp_path / "bad.jsonl")
    with pytest.raises(ConfigError, match="not found"):
        load_prompts([str(tmp_path / "missing.jsonl")])
    assert len(load_mt_bench(SHARED_DATA / "mt_bench_question.jsonl")) == 80
    assert len(load_humaneval(SHARED_DATA / "HumanEval.jsonl.gz", 3)) == 3


@pytest.mark.slow
def test_bench_end_to_end_on_the_tiny_pair(tiny_pair, tmp_path, capsys):
    from localspec.cli.main import main

    prompts = tmp_path / "two.jsonl"
    prompts.write_text(
        json.dumps({"prompt": "hello hello hello"}) + "\n" + json.dumps({"prompt": "def f(x): return x + x"}) + "\n"
    )
    out = tmp_path / "out"
    code = main(
        [
            "bench",
            "--models",
            str(tiny_pair["models_yaml"]),
            "--prompts",
            str(prompts),
            "--limit",
            "2",
            "--modes",
            "hf",
            "hf-pld",
            "hf-assisted",
            "none",
            "ngram",
            "draft",
            "head",
            "ngram+head",
            "adaptive",
            "--k",
            "1",
            "3",
            "--max-new-tokens",
            "12",
            "--out",
            str(out),
            "--no-progress",
            "--device",
            "cpu",
            "--adaptive-proposers",
            "draft",
            "ngram",
        ]
    )
    assert code == 0
    data = json.loads((out / "results.json").read_text())
    labels = [m["label"] for m in data["modes"]]
    assert labels[:3] == ["hf", "hf-pld K=3", "hf-assisted"]
    assert {"none", "ngram K=1", "ngram K=3", "draft K=1", "draft K=3"} <= set(labels)
    assert [label.split(",")[0] for label in labels if label.startswith("adaptive")] == [
        "adaptive (draft",
        "adaptive (ngram",
    ]
    assert any(note.startswith("head skipped") for note in data["notes"])
    assert any(note.startswith("ngram+head skipped") for note in data["notes"])  # the tiny pair has no head
    assert data["machine"]["load_before"]["load_1m"] >= 0 and "load average" in data["machine"]["load_after"]["uptime"]
    summary = data["summary"]
    assert summary["categories"] == ["two", "all"]
    for label in labels:
        row = summary["rows"][label]["all"]
        assert row["prompts"] == 2
        assert 2 <= row["tokens"] <= 24
        assert row["tokens_per_s"] > 0
        assert row["same_as_hf"] <= 2
    none = summary["rows"]["none"]["all"]
    assert none["speedup_vs_none"] == pytest.approx(1.0)
    assert none["drafted"] == 0 and none["mean_acceptance_length"] == pytest.approx(1.0)
    draft = summary["rows"]["draft K=3"]["all"]
    assert draft["drafted"] > 0 and 0 <= draft["acceptance_rate"] <= 1
    assert len(draft["per_position_acceptance"]) == 3
    assert sum(draft["time_share"].values()) == pytest.approx(1.0)
    assert summary["rows"]["hf"]["all"]["speedup_vs_hf"] == pytest.approx(1.0)
    assert set(summary["k_sweep"]) == {"ngram", "draft"}
    assert set(summary["k_sweep"]["draft"]["all"]) == {"1", "3"}
    # greedy ids agree with transformers' own greedy decoding on the same weights
    for prompt in data["prompts"]:
        hf_ids = prompt["results"]["hf"]["token_ids"]
        assert prompt["results"]["none"]["token_ids"] == hf_ids
        assert 1 <= len(hf_ids) <= 12
    assert any(t["target"].startswith("adaptive") for t in summary["targets"])
    table = (out / "results.md").read_text()
    assert "| mode |" in capsys.readouterr().out  # the table is printed too
    assert "| hf | two |" in table and "| none | all |" in table and "## K sweep" in table
    assert "load average" in table
    from localspec.verify.guarantee import SETUP_WORDS, guarantee_for

    # exact: auto decides per machine, at load, and the exact setup runs on the attention kernel where it loads
    path = data["guarantee"]["path"]
    setup = next(name for name, words in SETUP_WORDS.items() if path.endswith(f", {words} forwards"))
    stated = guarantee_for("float32", "none", "cpu", setup)  # the tiny pair's path: what "same as hf" means
    assert data["guarantee"] == stated.to_dict() and stated.text in table
    for name in ("tokens_per_s.png", "acceptance_by_position.png", "k_sweep.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"({name})" in table


def test_bench_rejects_bad_options(tiny_pair, tmp_path, capsys):
    from localspec.cli.main import main

    args = ["bench", "--models", str(tiny_pair["models_yaml"]), "--limit", "1", "--out", str(tmp_path), "--no-progress"]
    assert main(args + ["--modes", "warp"]) == 2
    assert "unknown bench mode" in capsys.readouterr().err
    assert main(args + ["--k", "0"]) == 2
    assert "--k values" in capsys.readouterr().err
    assert main(args + ["--adaptive-proposers", "head"]) == 2
    assert "has no 'head' proposer to adapt" in capsys.readouterr().err


def test_summary_ratios_sweep_and_targets_from_known_numbers():
    from localspec.bench.modes import Mode, RunResult
    from localspec.bench.prompts import BenchPrompt
    from localspec.bench.report import summarize, to_json, to_markdown
    from localspec.bench.runner import BenchRun, PromptRecord
    from localspec.engine.metrics import StatsSnapshot

    modes = [
        Mode("hf"),
        Mode("hf-pld", 4),
        Mode("none"),
        Mode("ngram", 1),
        Mode("ngram", 2),
        Mode("adaptive", 8, "ngram"),
    ]
    # seconds per 10-token answer, per category (chat, code)
    seconds = {
        "hf": (1.0, 1.0),
        "hf-pld K=4": (1.0, 0.8),
        "none": (0.8, 0.8),
        "ngram K=1": (0.95, 0.5),
        "ngram K=2": (1.0, 0.4),
        "adaptive (ngram, K≤8)": (0.82, 0.42),
    }
    records = []
    for index, category in enumerate(("chat", "code")):
        record = PromptRecord(BenchPrompt(f"{category}/0", category, ({"role": "user", "content": "x"},)), [1, 2])
        for mode in modes:
            ids = list(range(10)) if mode.label != "ngram K=2" or category == "chat" else list(range(9)) + [99]
            engine = mode.name not in ("hf", "hf-pld")
            stats = StatsSnapshot(
                target_forwards=5, drafted=8, accepted=4, per_position_drafted=(5, 3), per_position_accepted=(3, 1)
            )
            record.results[mode.label] = RunResult(
                ids, seconds[mode.label][index], seconds[mode.label][index] / 2, stats=stats if engine else None
            )
        records.append(record)
    run = BenchRun(
        "fake",
        modes,
        records,
        10,
        [],
        {
            "cpu_count": 2,
            "processor": "x",
            "torch": "t",
            "torch_threads": 1,
            "load_before": {"load_1m": 1.0},
            "load_after": {"load_1m": 2.0},
            "load_1m_during": {"min": 1.0, "max": 2.0, "mean": 1.5},
        },
    )
    summary = summarize(run)
    rows = summary["rows"]
    assert rows["none"]["chat"]["speedup_vs_hf"] == pytest.approx(1.25)
    assert rows["ngram K=2"]["code"]["speedup_vs_none"] == pytest.approx(2.0)
    assert rows["ngram K=2"]["all"]["tokens_per_s"] == pytest.approx(20 / 1.4)
    assert rows["ngram K=2"]["all"]["cpu_speedup_vs_none"] == pytest.approx(1.6 / 1.4)
    assert rows["ngram K=1"]["all"]["acceptance_rate"] == pytest.approx(0.5)
    assert rows["ngram K=1"]["all"]["mean_acceptance_length"] == pytest.approx(2.0)
    assert rows["ngram K=1"]["all"]["per_position_acceptance"] == pytest.approx([0.6, 1 / 3])
    assert rows["ngram K=2"]["code"]["same_as_hf"] == 0 and rows["ngram K=2"]["chat"]["exactly_hf"] == 1
    assert summary["k_sweep"]["ngram"]["best_k"] == {"chat": 1, "code": 2, "all": 2}
    targets = {t["target"]: t for t in summary["targets"]}
    assert targets["ngram K=2 / hf-pld K=4, all prompts"]["value"] == pytest.approx((20 / 1.4) / (20 / 1.8))
    chat_none = targets["adaptive (ngram, K≤8) / none, slowest category (chat)"]  # no category slower than none
    assert not chat_none["met"] and chat_none["value"] == pytest.approx(0.8 / 0.82)
    slow_chat = targets["ngram K=2 / none, slowest category (chat)"]
    assert not slow_chat["met"] and slow_chat["value"] == pytest.approx(0.8 / 1.0)
    code_best = targets["adaptive (ngram, K≤8) / best fixed (ngram K=2), code"]
    assert code_best["met"] and code_best["value"] == pytest.approx(0.4 / 0.42)
    assert not targets["best of our modes (adaptive (ngram, K≤8)) / hf, all prompts"]["met"]  # 1.61× < 2×
    table = to_markdown(to_json(run, summary))
    assert "| ngram K=2 | code | 25.0 | 2.50× | 2.00× |" in table


def test_bench_reports_the_dtype_decision_the_float32_baseline_and_per_row_costs(tiny_pair, tmp_path, monkeypatch):
    from localspec.cli.main import main
    from localspec.models import dtype_choice
    from localspec.runtime.model_runner import exact_setup

    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(dtype_choice, "candidates", lambda device: ["float32", "bfloat16"])

    per_row_setups = []

    def fake_timer(
        models, sizes, setups=None, context=64
    ):  # the dtype decision: bf16 twice as fast; the per-row table: 10 ms a row, 20 on the long cache
        if sizes == tuple(range(1, 10)):
            per_row_setups.append(setups)
            return {name: {s: 0.01 * s * (2 if context > 64 else 1) for s in sizes} for name in models}
        return {name: {s: 0.02 if m.dtype == torch.bfloat16 else 0.04 for s in sizes} for name, m in models.items()}

    monkeypatch.setattr(dtype_choice, "time_forwards", fake_timer)
    models = tmp_path / "models.yaml"
    models.write_text(
        f"- name: tiny-auto\n  target: {{source: {tiny_pair['target']}, dtype: auto}}\n  k: 3\n  exact: true\n"
        "  proposers: {ngram: {min_n: 1, max_n: 3}}\n"
    )
    prompts = tmp_path / "one.jsonl"
    prompts.write_text(json.dumps({"prompt": "hello hello hello"}) + "\n")
    out = tmp_path / "out"
    assert (
        main(
            [
                "bench",
                "--models",
                str(models),
                "--prompts",
                str(prompts),
                "--modes",
                "hf",
                "hf-fp32",
                "none",
                "--max-new-tokens",
                "8",
                "--out",
                str(out),
                "--no-progress",
                "--device",
                "cpu",
                "--no-warmup",
            ]
        )
        == 0
    )
    data = json.loads((out / "results.json").read_text())
    assert [m["label"] for m in data["modes"]] == ["hf", "hf-fp32", "none"]
    assert data["machine"]["dtype"]["dtype"] == "bfloat16" and data["machine"]["dtype"]["how"] == "measured"
    assert list(data["machine"]["verify_ms"]) == [str(t) for t in range(1, 10)]
    assert data["machine"]["verify_ms"]["9"] == pytest.approx(90.0)
    assert data["machine"]["verify_ms_long"]["context"] == 512
    assert data["machine"]["verify_ms_long"]["ms"]["9"] == pytest.approx(180.0)
    assert "| ms, 512 cached | 20.0 |" in (out / "results.md").read_text()
    from localspec.models.gguf_linear import library_here_now

    load = library_here_now()  # where the attention kernel loads, the loader offered it: the exact setup runs on it
    on_kernel = load.library is not None and load.library.attention is not None
    engine_setup = dataclasses.replace(exact_setup(torch.bfloat16), attention_kernel=on_kernel)
    assert per_row_setups == [{"target": engine_setup}] * 2  # the rows timed as the engine runs them, on each cache
    for prompt in data["prompts"]:
        assert 1 <= len(prompt["results"]["hf-fp32"]["token_ids"]) <= 8
    table = (out / "results.md").read_text()
    assert "Target dtype: bfloat16 (auto: 1-token 20 ms vs 40 ms float32" in table
    assert "| T tokens | 1 | 2 | 3 | 4 | 5 | 6 | 7 | 8 | 9 |" in table and "| × T=1 | 1.00 | 2.00 |" in table
    assert any("/ hf-fp32" in t["target"] for t in data["summary"]["targets"])
    bound = data["machine"]["bound"]  # the tiny target's bf16 linears and head, read at the measured bandwidth
    assert bound["bound_ms"] == pytest.approx(bound["weight_mb"] / 1e3 / bound["bandwidth_gbs"] * 1e3)
    assert f"the 1-token forward above is {10.0 / bound['bound_ms']:.1f}× that" in table


def test_chain_modes_run_chains_when_the_entry_drafts_trees(tiny_pair, tmp_path):
    """The entry's tree_nodes is the chat window's default; the bench's chain rows (ngram K=…, adaptive) must not
    silently run trees, or they would repeat the tree rows."""
    from localspec.bench.modes import Mode, engine_spec
    from localspec.chat import ChatSession
    from localspec.models.loading import load_pair
    from localspec.models.registry import load_registry

    entry = tiny_pair["models_yaml"].read_text().replace("tiny-target", str(tiny_pair["target"]))
    entry = entry.replace("tiny-draft", str(tiny_pair["draft"]))
    yaml_path = tmp_path / "models.yaml"
    yaml_path.write_text(entry + "  tree_nodes: 8\n")
    session = ChatSession(load_pair(load_registry(yaml_path)[0], device="cpu"))
    assert session.default_spec().tree_nodes == 8
    assert engine_spec(session, Mode("ngram", 3)).tree_nodes == 0
    assert engine_spec(session, Mode("adaptive", 3, "ngram")).tree_nodes == 0
    assert engine_spec(session, Mode("ngram-tree", None, "ngram", 4)).tree_nodes == 4
    assert engine_spec(session, Mode("adaptive-tree", 3, "ngram", 6)).tree_nodes == 6
    prompt = session.tokenizer.encode("abcabcabcabcabcabcabc")

    def most_drafted(mode):
        spec = engine_spec(session, mode)
        events = session.engine.generate(prompt, SamplingParams(max_new_tokens=24), spec, session.make_proposer(spec))
        return max(event.propose_token_num for event in events)

    assert most_drafted(Mode("ngram", 3)) == 3  # a chain of 3 at most, though the entry says trees of 8
    assert most_drafted(Mode("ngram-tree", None, "ngram", 8)) > 3
