"""The bench's JSON-schema task: the shipped set (`--prompts json-schema`) and schemas in a user's file, the
separate schema checker (it catches what breaks a schema, and refuses keywords it does not know), and the task end
to end on the tiny pair: constrained answers, every one valid, speculation equal to plain constrained decoding."""

from __future__ import annotations

import json

import pytest

from localspec.bench.prompts import load_prompts
from localspec.bench.schema_check import check_supported, errors, is_valid
from localspec.config import ConfigError

CITY = {
    "type": "object",
    "properties": {
        "name": {"enum": ["Paris", "Rome"]},
        "rank": {"type": "integer", "minimum": 1, "maximum": 9},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 2},
        "capital": {"type": "boolean"},
    },
    "required": ["name", "rank", "tags", "capital"],
    "additionalProperties": False,
}


def test_the_shipped_set_loads_with_a_schema_per_prompt():
    prompts = load_prompts(["json-schema"])
    assert len(prompts) >= 3 and all(p.schema is not None for p in prompts)
    assert {p.category for p in prompts} == {"json_schema"}
    for p in prompts:
        check_supported(p.schema)
    assert len(load_prompts(["json-schema"], limit=2)) == 2


@pytest.mark.parametrize(
    "value, broken",
    [
        ({"name": "Oslo", "rank": 1, "tags": [], "capital": True}, "not in the enum"),
        ({"name": "Rome", "rank": 10, "tags": [], "capital": True}, "10 > 9"),
        ({"name": "Rome", "rank": 1.5, "tags": [], "capital": True}, "not an integer"),
        ({"name": "Rome", "rank": 1, "tags": ["long"], "capital": True}, "length 4"),
        ({"name": "Rome", "rank": 1, "tags": ["a", "b", "c"], "capital": True}, "3 items"),
        ({"name": "Rome", "rank": 1, "tags": []}, "'capital' is missing"),
        ({"name": "Rome", "rank": 1, "tags": [], "capital": 1}, "not a boolean"),
        ({"name": "Rome", "rank": 1, "tags": [], "capital": True, "x": 0}, "'x' is not allowed"),
    ],
)
def test_the_checker_finds_what_breaks_a_schema(value, broken):
    found = errors(value, CITY)
    assert any(broken in e for e in found), found
    assert not is_valid(json.dumps(value), CITY)


def test_the_checker_passes_a_valid_value_and_refuses_what_it_cannot_check():
    assert is_valid('{"name": "Paris", "rank": 2, "tags": ["a"], "capital": false}', CITY)
    assert not is_valid('{"name": "Paris", "rank": 2, ', CITY)  # cut short: not JSON
    with pytest.raises(ConfigError, match="'anyOf'"):
        check_supported({"type": "object", "properties": {"a": {"anyOf": [{"type": "string"}]}}})


def test_a_prompt_file_with_a_bad_schema_is_refused_naming_the_entry(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps({"prompt": "a city", "schema": CITY}) + "\n")
    assert load_prompts([str(path)])[0].schema == CITY
    path.write_text(json.dumps({"prompt": "a city", "schema": {"type": "object", "oneOf": []}}) + "\n")
    with pytest.raises(ConfigError, match="entry 1's schema"):
        load_prompts([str(path)])


@pytest.mark.slow
def test_the_json_schema_task_end_to_end_on_the_tiny_pair(tiny_pair, tmp_path):
    from localspec.cli.main import main

    prompts = tmp_path / "cities.jsonl"
    rows = [{"id": i, "prompt": f"City {i} as JSON.", "schema": CITY} for i in range(2)]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    args = ["bench", "--models", str(tiny_pair["models_yaml"]), "--prompts", str(prompts), "--out", str(out)]
    args += ["--modes", "hf", "none", "ngram", "draft", "--k", "3", "--max-new-tokens", "120"]
    assert main([*args, "--no-progress", "--no-warmup", "--device", "cpu"]) == 0
    data = json.loads((out / "results.json").read_text())
    assert [m["label"] for m in data["modes"]] == ["none", "ngram K=3", "draft K=3"]
    assert any(n.startswith("hf skipped") and "JSON-schema" in n for n in data["notes"])
    rows = data["summary"]["rows"]
    for label in ("none", "ngram K=3", "draft K=3"):
        row = rows[label]["all"]
        assert row["schema_answers"] == 2 and row["schema_valid"] == 2 and row["schema_cut"] == 0
    assert rows["draft K=3"]["all"]["same_as_none"] == 2 and rows["ngram K=3"]["all"]["same_as_none"] == 2
    assert rows["draft K=3"]["all"]["accepted"] > 0  # at least the forced tokens are drafted and kept
    for prompt in data["prompts"]:
        assert all(result["schema_valid"] is True for result in prompt["results"].values())
    table = (out / "results.md").read_text()
    assert "## JSON-schema task" in table and "| none | cities |" in table and "100% (2/2) | 0 |" in table


@pytest.mark.parametrize(
    "ids, valid",
    [([1, 9], True), ([2, 9], False), ([1], None)],  # complete and valid, complete and invalid, cut short
    ids=["valid", "invalid", "cut"],
)
def test_a_complete_answer_is_checked_and_a_cut_one_counted_apart(monkeypatch, ids, valid):
    from types import SimpleNamespace

    from localspec.bench import runner
    from localspec.bench.modes import Mode, RunResult
    from localspec.bench.prompts import BenchPrompt

    texts = {1: '{"name": "Rome", "rank": 3, "tags": [], "capital": true}', 2: '{"name": "Oslo"}', 9: ""}
    tokenizer = SimpleNamespace(decode=lambda ids, skip_special_tokens: "".join(texts[i] for i in ids))
    session = SimpleNamespace(engine=SimpleNamespace(stop_token_ids=frozenset({9})), tokenizer=tokenizer)
    monkeypatch.setattr(runner, "run_mode", lambda *args: RunResult(list(ids), 1.0, 1.0))
    record = runner.PromptRecord(BenchPrompt("t/0", "t", (), schema=CITY), [0])
    assert record.answer(session, Mode("none"), 8).schema_valid is valid
