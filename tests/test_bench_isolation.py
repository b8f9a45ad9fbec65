"""The bench measures one mode at a time: each mode keeps its own controllers from the state a user's first answer
meets, warm-up answers prompts that are never timed and learn nothing that stays, and --repeat reports medians
with their spread."""

from __future__ import annotations

import json

import pytest


def test_each_mode_keeps_its_own_controllers_and_warm_up_is_not_timed(tiny_session, monkeypatch):
    from localspec.bench import modes as bench_modes
    from localspec.bench import runner
    from localspec.bench.modes import Mode
    from localspec.bench.prompts import BenchPrompt

    engine = tiny_session.engine
    loaded_state = engine.controllers
    seen: list[tuple[str, int, tuple[int, ...], int]] = []  # (mode, id of its controllers, prompt ids, max tokens)
    real = bench_modes.run_mode

    def spy(session, mode, prompt_ids, max_new_tokens, constraint=None):
        seen.append((mode.label, id(session.engine.controllers), tuple(prompt_ids), max_new_tokens))
        return real(session, mode, prompt_ids, max_new_tokens, constraint)

    monkeypatch.setattr(runner, "run_mode", spy)
    prompts = [
        BenchPrompt(f"p/{i}", "p", ({"role": "user", "content": text},)) for i, text in enumerate(["ab ab ab", "cd cd"])
    ]
    modes = [Mode("adaptive", 3, "ngram"), Mode("adaptive-tree", 3, "ngram", 4), Mode("none")]
    run = runner.run_bench(tiny_session, prompts, modes, 40, progress=False, measure_rows=False)
    assert engine.controllers is loaded_state  # the session's own controllers are given back untouched
    timed_ids = {tuple(r.prompt_ids) for r in run.records}
    warm = [s for s in seen if s[3] == runner.WARMUP_TOKENS]
    timed = [s for s in seen if s[3] == 40]
    assert len(warm) == len(runner.WARMUP_MESSAGES) * len(modes) and len(timed) == len(prompts) * len(modes)
    assert not {s[2] for s in warm} & timed_ids  # warm-up prompts are never timed ones
    per_mode = {label: {c for lab, c, _, _ in timed if lab == label} for label in {m.label for m in modes}}
    assert all(len(ids) == 1 for ids in per_mode.values())  # one set of controllers per mode, across its prompts
    assert len({next(iter(ids)) for ids in per_mode.values()}) == len(modes)  # and no two modes share one
    assert not {c for _, c, _, _ in warm} & {next(iter(ids)) for ids in per_mode.values()}
    assert id(loaded_state) not in {c for _, c, _, _ in seen}


def test_spread_and_combined_runs():
    from localspec.bench.repeat import spread

    s = spread([1.2, 0.9, 1.5, None])
    assert (s.median, s.low, s.high, s.runs) == (1.2, 0.9, 1.5, 3)
    assert s.text() == "1.20 (0.90–1.50)"
    assert spread([None]) is None


@pytest.mark.slow  # three full bench runs on the tiny pair through the command line
def test_repeat_reports_the_median_of_the_runs(tiny_pair, tmp_path, capsys):
    from localspec.cli.main import main

    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "hello hello hello"}) + "\n")
    out = tmp_path / "out"
    args = [
        "bench",
        "--models",
        str(tiny_pair["models_yaml"]),
        "--prompts",
        str(prompts),
        "--modes",
        "hf",
        "none",
        "ngram",
        "--k",
        "2",
        "--max-new-tokens",
        "8",
        "--out",
        str(out),
        "--no-progress",
        "--device",
        "cpu",
    ]
    assert main(args + ["--repeat", "0"]) == 2
    assert main(args + ["--repeat", "3"]) == 0
    combined = json.loads((out / "repeat.json").read_text())
    runs = [json.loads((out / f"run-{i}" / "results.json").read_text()) for i in (1, 2, 3)]
    label = "ngram K=2"
    ratios = sorted(r["summary"]["rows"][label]["all"]["speedup_vs_none"] for r in runs)
    assert combined[label]["all"]["speedup_vs_none"]["median"] == pytest.approx(ratios[1])
    assert combined[label]["all"]["speedup_vs_none"]["low"] == pytest.approx(ratios[0])
    assert "Median of 3 interleaved runs" in capsys.readouterr().out
