"""The history proposers: a suffix index over saved messages, its lookup, its file beside the database, and greedy
output identical to plain decoding."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from localspec.config import SamplingParams, SpecConfig
from localspec.proposers.history import HistoryProposer, SuffixIndex
from localspec.store.db import ConversationStore
from localspec.store.history import PairHistory

GREEDY = SamplingParams()
GEN = torch.Generator()


def test_the_index_finds_the_longest_suffix_and_forgets_removed_documents():
    index = SuffixIndex()
    index.add("a", [1, 2, 3, 4, 5, 6])
    index.add("b", [9, 2, 3, 7, 8])
    n, found = index.continuations(np.array([0, 2, 3]), max_n=8, depth=3)
    assert (n, found) == (2, [[7, 8], [4, 5, 6]])  # both match 2 tokens: the most recent document first
    n, found = index.continuations(np.array([1, 2, 3]), max_n=8, depth=3)
    assert (n, found) == (3, [[4, 5, 6]])  # a longer match wins
    assert index.remove("a") and not index.remove("a")
    assert index.continuations(np.array([1, 2, 3]), max_n=8, depth=3) == (2, [[7, 8]])
    assert index.continuations(np.array([3]), max_n=8, depth=3) == (0, [])  # one token is not a lookup
    index.add("b", [5, 5])  # a key added again replaces its document
    assert len(index) == 1 and index.continuations(np.array([2, 3]), 8, 3) == (0, [])


def test_the_first_source_comes_before_the_context_and_the_history():
    index = SuffixIndex()
    index.add(1, [10, 11, 12, 13, 14])
    proposer = HistoryProposer(index, first_source=[10, 11, 20, 21, 22])
    proposer.begin([5, 10, 11], None)
    assert proposer.propose([5, 10, 11], 3, GREEDY, GEN).token_ids == [20, 21, 22]
    plain = HistoryProposer(index)
    plain.begin([5, 10, 11], None)
    assert plain.propose([5, 10, 11], 3, GREEDY, GEN).token_ids == [12, 13, 14]
    context = [10, 11, 30, 31, 10, 11]  # the current conversation beats older ones at equal match length
    assert HistoryProposer(index).propose(context, 2, GREEDY, GEN).token_ids == [30, 31]
    tree = HistoryProposer(index, first_source=[10, 11, 20, 21]).propose_tree(context, 7, GREEDY, GEN)
    assert tree.token_ids[0] == 20  # the best-weighted branch first, every source merged
    assert set(tree.token_ids) == {20, 21, 30, 31, 10, 11, 12}  # weights 4 (first), 2 (context), 1 (history)
    assert HistoryProposer(SuffixIndex()).propose([1, 2], 3, GREEDY, GEN).token_ids == []


def _store_with_answers(path, tiny_session):
    store = ConversationStore(path / "conversations.db")
    cid = store.create_conversation("one", "tiny")
    store.add_message(cid, "user", "Say the alphabet please")
    answer = store.start_answer(cid, "tiny", "ngram", 4, None, 0)
    ids = tiny_session.tokenizer.encode("abcdefghijklmnopqrstuvwxyz", add_special_tokens=False)
    store.append_tokens(answer, [{"id": i, "text": "x", "kind": "target"} for i in ids])
    store.finish_answer(answer, "stop", None, None)
    other = store.create_conversation("two", "other-pair")
    store.add_message(other, "user", "not for this pair")
    return store, cid, answer, ids


def test_the_index_file_is_read_back_rebuilt_when_damaged_and_follows_deletes(tmp_path, tiny_session):
    store, cid, answer, ids = _store_with_answers(tmp_path, tiny_session)
    tokenize = lambda text: tiny_session.tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    folder = tmp_path / "history"
    first = PairHistory(store, "tiny", tokenize, folder)
    assert first.rebuilt and first.path.exists() and len(first.index) == 2  # the answer and its user message
    assert first.index.continuations(np.array(ids[:3]), 16, 4)[1] == [ids[3:7]]
    again = PairHistory(store, "tiny", tokenize, folder)
    assert not again.rebuilt and len(again.index) == 2  # read from the file
    first.path.write_bytes(b"garbage")
    damaged = PairHistory(store, "tiny", tokenize, folder)
    assert damaged.rebuilt and damaged.index.continuations(np.array(ids[:3]), 16, 4)[1] == [ids[3:7]]
    assert damaged.forget_conversation(cid) == 2 and len(damaged.index) == 0
    store.delete_conversation(cid)
    after = PairHistory(store, "tiny", tokenize, folder)
    assert len(after.index) == 0  # nothing of a deleted conversation comes back


def test_a_conversation_deleted_while_the_app_was_closed_is_not_read_back(tmp_path, tiny_session):
    store, cid, _answer, _ids = _store_with_answers(tmp_path, tiny_session)
    tokenize = lambda text: tiny_session.tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    PairHistory(store, "tiny", tokenize, tmp_path / "history")
    store.delete_conversation(cid)  # the file still lists its messages
    reopened = PairHistory(store, "tiny", tokenize, tmp_path / "history")
    assert reopened.rebuilt and len(reopened.index) == 0


@pytest.mark.parametrize("tree_nodes", [0, 6])
@pytest.mark.parametrize("proposer", ["history", "history+head"])
def test_greedy_history_output_is_plain_decoding(tiny_session, proposer, tree_nodes):
    if proposer not in tiny_session.proposers:
        pytest.skip(f"the tiny pair has no {proposer}")
    prompt, _ = tiny_session.prompt_ids([{"role": "user", "content": "abc abc abc, then what?"}], 40)
    plain = [
        t.token_id
        for e in tiny_session.engine.generate(
            prompt, SamplingParams(max_new_tokens=40), SpecConfig(proposer="none"), None
        )
        for t in e.tokens
    ]
    tiny_session.history = SuffixIndex()
    tiny_session.history.add("earlier", plain[5:30])  # an earlier answer that shares most of this one
    spec = tiny_session.default_spec(proposer=proposer, k=4, tree_nodes=tree_nodes, adaptive=False)
    for first_source in ([], plain):
        made = tiny_session.make_proposer(spec, first_source=first_source)
        events = list(tiny_session.engine.generate(prompt, SamplingParams(max_new_tokens=40), spec, made))
        assert [t.token_id for e in events for t in e.tokens] == plain
        if first_source:  # regenerating a greedy answer: almost every token is a draft the target accepted
            accepted = sum(t.kind == "accepted" for e in events for t in e.tokens)
            assert accepted >= len(plain) // 2
    tiny_session.history = SuffixIndex()


def test_every_pair_with_an_ngram_lookup_offers_history(tiny_session):
    assert "history" in tiny_session.proposers
    assert isinstance(tiny_session.make_proposer(tiny_session.default_spec(proposer="history")), HistoryProposer)


def test_the_app_keeps_the_index_in_step_with_what_it_saves(tiny_pair, tmp_path):
    """Through the manager and the store, as the chat window runs them: an answer saved joins the loaded pair's
    index, Regenerate passes the replaced answer as the first source, deleting the conversation empties it."""
    from localspec.chat import ChatSession
    from localspec.models.loading import load_pair
    from localspec.models.registry import load_registry
    from localspec.store.history import HistoryBook
    from localspec.ui.manager import ModelManager, drain
    from localspec.ui.recorder import Recorder

    pairs = load_registry(tiny_pair["models_yaml"])
    manager = ModelManager(pairs, lambda pair, progress: ChatSession(load_pair(pair, device="cpu")))
    manager.load(pairs[0].name)
    store = ConversationStore(tmp_path / "conversations.db")
    book = HistoryBook(store)
    manager.attach_history(book)
    session = manager.session
    assert session.history is book.pairs[pairs[0].name].index and len(session.history) == 0
    recorder = Recorder(store)
    sampling = SamplingParams(max_new_tokens=24)

    def answer(first_source=(), regenerate=False):
        sink = recorder.sink("tab", "abc abc abc", None, regenerate=regenerate)
        out = manager.answer(
            [{"role": "user", "content": "abc abc abc"}],
            sampling,
            lambda s: s.default_spec(proposer="history", adaptive=False, tree_nodes=0),
            threading.Event(),
            sink,
            "tab",
            first_source,
        )
        records = []
        while True:
            messages = list(drain(out, 0.2))
            records += [r for m in messages if m.kind == "event" for r in m.records]
            if any(m.kind == "done" for m in messages):
                return records

    first = answer()
    ids = [r["id"] for r in first]
    assert len(session.history) == 2  # the user message and the answer, saved and indexed
    again = answer(first_source=tuple(ids), regenerate=True)
    assert [r["id"] for r in again] == ids  # greedy: the same answer, now drafted from the replaced one
    assert sum(r["kind"] == "accepted" for r in again) >= len(ids) // 2
    (summary,) = store.list_conversations()
    store.delete_conversation(summary.id)
    assert len(session.history) == 0
    reopened = HistoryBook(store).index_for(pairs[0].name, lambda text: [])
    assert len(reopened) == 0
