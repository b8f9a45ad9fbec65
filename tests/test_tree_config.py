"""tree_nodes on every surface: models.yaml (one range rule, a message naming the entry), `localspec generate
--tree-nodes`, and the UI's control."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localspec.config import TREE_NODES_MAX, ConfigError
from localspec.models.registry import parse_registry

ENTRY = "- name: a\n  target: {source: x/y}\n"


def test_an_entry_sets_tree_nodes_and_defaults_to_chains():
    (chains,) = parse_registry(ENTRY, Path("/tmp"))
    assert chains.tree_nodes == 0
    (trees,) = parse_registry(ENTRY + "  tree_nodes: 8\n", Path("/tmp"))
    assert trees.tree_nodes == 8


@pytest.mark.parametrize("bad", ["40", "-1", "many", "true", "2.5"])
def test_a_bad_tree_nodes_names_the_entry_and_the_range(bad):
    with pytest.raises(ConfigError) as caught:
        parse_registry(ENTRY + f"  tree_nodes: {bad}\n", Path("/tmp"))
    message = str(caught.value)
    assert message.startswith("models.yaml entry 1 ('a'): field 'tree_nodes' must be a whole number between 0 and")
    assert f"and {TREE_NODES_MAX}" in message and "0 drafts chains" in message


def test_the_session_default_spec_carries_the_entrys_tree_nodes(tiny_session):
    from dataclasses import replace

    session = tiny_session
    original = session.loaded.spec
    try:
        session.loaded.spec = replace(original, tree_nodes=6)
        assert session.default_spec().tree_nodes == 6
        assert session.default_spec(tree_nodes=0).tree_nodes == 0
    finally:
        session.loaded.spec = original


def test_generate_takes_tree_nodes_and_reports_it(tiny_pair, capsys):
    from localspec.cli.main import main

    args = ["generate", "--json", "--prompt", "hi", "--max-new-tokens", "6", "--models", str(tiny_pair["models_yaml"])]
    assert main(args + ["--tree-nodes", "5"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["tree_nodes"] == 5 and len(out["token_ids"]) <= 6
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["tree_nodes"] == 0  # the entry's default


def test_generate_refuses_a_bad_tree_nodes_before_loading(tiny_pair, capsys):
    from localspec.cli.main import main

    args = ["generate", "--prompt", "hi", "--models", str(tiny_pair["models_yaml"]), "--tree-nodes", "33"]
    assert main(args) == 2
    assert "--tree-nodes must be a whole number between 0 and 32 (got 33)" in capsys.readouterr().err
