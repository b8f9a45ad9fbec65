"""Each part of a pair (target, draft, head) loads and is checked on its own (issue 19, item 1): a failed draft or head
is left out with a notice naming the file and the reason, and the pair answers with what loaded."""

from __future__ import annotations

import gc
import json
import shutil

import pytest
import torch

from localspec.chat import ChatSession
from localspec.config import ConfigError, SamplingParams, SpecConfig
from localspec.heads.io import save_head
from localspec.models.loading import load_pair
from localspec.models.registry import parse_registry
from localspec.ui.manager import ModelManager
from tests.support import make_head

YAML = """- name: parts
  target: {source: tiny-target}
  proposers:
    ngram: {min_n: 1, max_n: 3}
    draft: {source: %(draft)s}
    head: %(head)s
  default_proposer: %(default)s
  k: 3
"""


@pytest.fixture(scope="module")
def folders(tiny_pair, tiny_models, tmp_path_factory):
    root = tmp_path_factory.mktemp("parts")
    shutil.copytree(tiny_pair["target"], root / "tiny-target")
    shutil.copytree(tiny_pair["draft"], root / "tiny-draft")
    shutil.copytree(tiny_pair["draft"], root / "swapped-draft")
    path = root / "swapped-draft" / "tokenizer.json"
    data = json.loads(path.read_text())
    vocab = data["model"]["vocab"]
    vocab["a"], vocab["b"] = vocab["b"], vocab["a"]  # two ids mapped differently, the same size
    path.write_text(json.dumps(data))
    save_head(make_head(tiny_models[0], "eagle"), root / "good-head")
    shutil.copytree(root / "good-head", root / "garbage-head")
    (root / "garbage-head" / "head.safetensors").write_bytes(b"\xff" * 64)
    return root


def _load(root, draft="tiny-draft", head="good-head", default="head"):
    pair = parse_registry(YAML % dict(draft=draft, head=head, default=default), root)[0]
    return load_pair(pair, device="cpu")


def _answer(session, proposer):
    events = list(
        session.stream_ids(
            [1, 72, 101, 108], SamplingParams(max_new_tokens=6), session.default_spec(proposer=proposer), None
        )
    )
    assert events[-1].finish_reason in ("length", "stop"), events[-1].error
    return events


def test_every_part_loads(folders):
    loaded = _load(folders)
    assert loaded.notices == () and loaded.proposers == (
        "none",
        "ngram",
        "draft",
        "head",
        "ngram+head",
        "history",
        "history+head",
    )


def test_garbage_head_is_dropped_naming_the_file(folders):
    loaded = _load(folders, head="garbage-head")
    assert loaded.head is None and "head" not in loaded.proposers and "ngram+head" not in loaded.proposers
    assert len(loaded.notices) == 1
    assert str(folders / "garbage-head" / "head.safetensors") in loaded.notices[0]
    assert "not a readable safetensors file" in loaded.notices[0]
    session = ChatSession(loaded)
    assert session.default_spec().proposer == "ngram"  # the entry's default (head) did not load
    _answer(session, "draft")
    with pytest.raises(ConfigError, match="no 'head' proposer.*head.safetensors"):
        session.make_proposer(SpecConfig(proposer="head"))


def test_missing_head_folder_is_dropped_naming_it(folders):
    loaded = _load(folders, head="no-such-head")
    assert loaded.head is None and loaded.proposers == ("none", "ngram", "draft", "history")
    assert str(folders / "no-such-head") in loaded.notices[0] and "config.json" in loaded.notices[0]


def test_draft_with_two_ids_swapped_leaves_the_pair_answering(folders):
    loaded = _load(folders, draft="swapped-draft", default="draft")
    assert loaded.draft is None and loaded.proposers == (
        "none",
        "ngram",
        "head",
        "ngram+head",
        "history",
        "history+head",
    )
    assert str(folders / "swapped-draft" / "tokenizer.json") in loaded.notices[0]
    assert "2 of its" in loaded.notices[0]
    session = ChatSession(loaded)
    for proposer in ("none", "ngram", "head"):
        _answer(session, proposer)


def test_the_status_line_names_the_dropped_part(folders):
    loaded = _load(folders, head="garbage-head")
    manager = ModelManager([loaded.spec], lambda pair, progress: ChatSession(loaded))
    manager.load(None)
    assert "parts is ready." in manager.ready_text() and "head.safetensors" in manager.ready_text()


def test_heads_do_not_keep_an_old_target_alive(tiny_models, folders):
    from localspec.proposers.head import _HEADS, cached_head

    source = tiny_models[0]
    target = type(source)(source.config).eval()
    target.load_state_dict(source.state_dict())
    head = cached_head(folders / "good-head", target, "cpu")
    assert cached_head(folders / "good-head", target, "cpu") is head  # loaded once per target
    del head
    count = len(_HEADS)
    del target
    gc.collect()
    assert len(_HEADS) == count - 1
    assert torch.is_tensor(source.get_input_embeddings().weight)
