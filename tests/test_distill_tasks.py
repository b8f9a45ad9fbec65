"""The head's training prompts by task type (localspec/distill/tasks.py): every type is there, none pastes a document
the tuning or evaluation sets paste, conversations reach the chat template as turns, and the training list mixes
them in."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from localspec.distill.corpus import encode_chat
from localspec.distill.data import training_prompts
from localspec.distill.tasks import PROMPT_SET_MODULES, TASK_TYPES, task_prompts
from tests.conftest import SHARED_DATA

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def prompts():
    return task_prompts(40, SHARED_DATA, seed=0)


def flat(prompt) -> str:
    return " ".join(" ".join((prompt,) if isinstance(prompt, str) else prompt).split())


def test_every_task_type_has_prompts(prompts):
    assert set(prompts) == set(TASK_TYPES)
    for kind, rows in prompts.items():
        if kind == "math" and not (SHARED_DATA / "gsm8k_train_400.jsonl").exists():
            continue
        assert len(rows) >= 20, kind
    assert all(isinstance(p, tuple) and len(p) == 3 for p in prompts["multi-turn"])
    assert all(isinstance(p, str) for kind in TASK_TYPES if kind != "multi-turn" for p in prompts[kind])


def test_the_prompt_sets_modules_are_the_ones_left_out():
    script = ast.parse((REPO / "scripts" / "make_prompt_sets.py").read_text(encoding="utf-8"))
    pasted = {
        alias.name
        for node in script.body
        if isinstance(node, ast.Import)
        for alias in node.names
        if alias.asname and alias.asname.startswith("_")
    }
    assert pasted == PROMPT_SET_MODULES


def test_no_prompt_pastes_a_document_of_the_prompt_sets(prompts):
    texts = [flat(p) for rows in prompts.values() for p in rows]
    for name in PROMPT_SET_MODULES:
        doc = " ".join((importlib.import_module(name).__doc__ or "").split())
        for sentence in (s for s in doc.split(". ") if len(s) > 60):
            assert not any(sentence in t for t in texts), (name, sentence)


def test_a_conversation_is_encoded_turn_by_turn(tiny_pair):
    from transformers import AutoTokenizer

    tiny_tokenizer = AutoTokenizer.from_pretrained(tiny_pair["target"])
    ids = encode_chat(tiny_tokenizer, ("Tell me about heaps.", "A heap is a tree.", "Shorter?"))
    text = tiny_tokenizer.decode(ids)
    assert text.index("Tell me about heaps.") < text.index("A heap is a tree.") < text.index("Shorter?")
    assert encode_chat(tiny_tokenizer, "Hi") == encode_chat(tiny_tokenizer, ("Hi",))


def test_training_prompts_mix_in_every_task_type(prompts):
    mixed = training_prompts(SHARED_DATA, stdlib_limit=20, per_task_type=40)
    head = mixed[:200]
    assert any(isinstance(p, tuple) for p in head)  # multi-turn, early in the interleaved list
    for kind in ("translation", "summarization", "document-qa", "factual-qa"):
        assert set(prompts[kind]) & set(mixed), kind
