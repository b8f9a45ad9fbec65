"""models.yaml that tries to exhaust memory: anchor bombs, deep nesting, huge values in error messages."""

from __future__ import annotations

from pathlib import Path

import pytest

from localspec.config import SHOWN_CHARS, ConfigError, shown
from localspec.models.registry import MAX_EXPANDED_NODES, expanded_size, parse_registry_lenient

GOOD = "- name: ok\n  target: {source: some/model}\n  proposers: {ngram: {}}\n"


def bomb(field: str, levels: int = 9) -> str:
    """An entry whose `field` is an alias that expands to 9**levels values (a few hundred bytes of YAML)."""
    lines = ['- &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels):
        prev = f"*a{i - 1}"
        lines.append(f"- &a{i} [{', '.join([prev] * 9)}]")
    return "\n".join(lines) + f"\n- name: bomb\n  target: {{source: some/model}}\n  {field}: *a{levels - 1}\n"


@pytest.mark.parametrize("field", ["k", "description", "tree_nodes"])
def test_an_anchor_bomb_is_refused_before_it_expands(field):
    text = bomb(field)
    assert len(text) < 1024
    with pytest.raises(ConfigError, match="anchors") as info:
        parse_registry_lenient(GOOD + text, Path("."), "models.yaml")
    assert "models.yaml" in str(info.value) and len(str(info.value)) < 300


def test_expansion_is_counted_without_expanding():
    import yaml

    assert expanded_size(yaml.compose(bomb("k", 4))) > 9**4  # 6,561 leaves, below the bound
    pairs, broken = parse_registry_lenient(GOOD + bomb("k", 4), Path("."))
    assert [p.name for p in pairs] == ["ok"]  # the small bomb entry is just a broken entry: k is a list
    assert any("a list of" in b.error for b in broken)
    assert all(len(b.error) < 400 for b in broken)
    assert expanded_size(yaml.compose(bomb("k", 9))) > MAX_EXPANDED_NODES
    recursive = yaml.compose("&a [1, *a]")
    assert expanded_size(recursive) == 3


def test_deep_nesting_is_a_clear_error():
    with pytest.raises(ConfigError, match="nests too deeply|not valid YAML"):
        parse_registry_lenient("[" * 50_000, Path("."), "models.yaml")


def test_error_messages_quote_a_bounded_part():
    assert len(shown("x" * 10_000_000)) <= SHOWN_CHARS + 4
    assert shown(list(range(10**6))) == "a list of 1000000 items"
    assert shown(10**5000) == "a very large number" and shown(3) == "3" and shown(None) == "None"
    pairs, broken = parse_registry_lenient(
        GOOD + f"- name: big\n  target: {{source: a/b, quant: {'q' * 100_000}}}\n", Path(".")
    )
    assert len(broken) == 1 and len(broken[0].error) < 300
    _pairs, broken = parse_registry_lenient(
        GOOD + "- name: d\n  target: {source: a/b}\n  description: {a: 1}\n", Path(".")
    )
    assert "description" in broken[0].error and "must be text" in broken[0].error
