"""A history index (history/*.npz) is input like any other file (issue 46, case 5): ids past the vocabulary never
reach the model (they made every 'history' answer fail with "index out of range in self"), and a 60 KB file that
inflates to millions of tokens is refused before it is decompressed. The rest of the history keeps working."""

from __future__ import annotations

import tracemalloc

import numpy as np

from localspec.config import SamplingParams
from localspec.store.db import ConversationStore
from localspec.store.history import PairHistory, index_path


def answered(store: ConversationStore, model: str, user: str, ids: list[int]) -> tuple[int, int]:
    cid = store.create_conversation("one", model)
    store.add_message(cid, "user", user)
    answer = store.start_answer(cid, model, "history", 4)
    store.append_tokens(answer, [{"id": i, "text": "x", "kind": "target"} for i in ids])
    store.finish_answer(answer, "stop")
    return cid, answer


def rewrite(path, **arrays) -> None:
    with np.load(path) as data:
        saved = {name: data[name] for name in data.files}
    np.savez_compressed(path, **{**saved, **arrays})


def test_ids_past_the_vocabulary_never_reach_the_model(tiny_pair, tmp_path):
    """Through the manager, as the app gives a loaded pair its history: the file says an earlier answer continued
    the prompt's last two tokens with ids past the vocabulary; the answer must still come, equal to plain decoding."""
    from localspec.chat import ChatSession
    from localspec.models.loading import load_pair
    from localspec.models.registry import load_registry
    from localspec.store.history import HistoryBook
    from localspec.ui.manager import ModelManager

    pairs = load_registry(tiny_pair["models_yaml"])
    name = pairs[0].name
    manager = ModelManager(pairs, lambda pair, progress: ChatSession(load_pair(pair, device="cpu")))
    manager.load(name)
    session = manager.session
    vocab = session.engine.target.vocab_size
    prompt, _ = session.prompt_ids([{"role": "user", "content": "abc abc abc"}], 16)
    store = ConversationStore(tmp_path / "conversations.db")
    answered(store, name, "earlier", prompt[-2:] + [1, 2])
    tokenize = lambda text: session.tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    first = PairHistory(store, name, tokenize, tmp_path / "history")
    assert first.rebuilt
    with np.load(first.path) as data:
        tokens = data["tokens"].copy()
    tokens[-2:] = [vocab + 5, vocab + 6]  # the answer's last two ids, now past the vocabulary
    rewrite(first.path, tokens=tokens)
    manager.attach_history(HistoryBook(store, tmp_path / "history"))
    spec = session.default_spec(proposer="history", k=2, tree_nodes=0, adaptive=False)
    sampling = SamplingParams(max_new_tokens=8)
    events = list(session.engine.generate(prompt, sampling, spec, session.make_proposer(spec)))
    plain = list(session.engine.generate(prompt, sampling, session.default_spec(proposer="none"), None))
    assert [t.token_id for e in events for t in e.tokens] == [t.token_id for e in plain for t in e.tokens]
    held = manager.history.pairs[name]
    assert held.rebuilt and any(f"token id {vocab + 5}" in p for p in held.problems)
    assert len(session.history) == 2  # rebuilt from the database: both messages still drafted from


def test_a_saved_answer_with_ids_past_the_vocabulary_is_left_out_and_the_rest_kept(tmp_path):
    store = ConversationStore(tmp_path / "conversations.db")
    _, good = answered(store, "pair", "hello", [5, 6, 7, 8])
    _, bad = answered(store, "pair", "again", [5, 6, 1000])
    history = PairHistory(store, "pair", lambda text: [1, 2, 3], tmp_path / "history", vocab_size=100)
    assert good in history.conversation_of and bad not in history.conversation_of
    assert len(history.index) == 3 and any(f"message {bad}" in p and "1000" in p for p in history.problems)


def test_a_small_file_that_inflates_to_millions_of_tokens_is_refused_before_decompressing(tmp_path):
    store = ConversationStore(tmp_path / "conversations.db")
    cid = store.create_conversation("one", "pair")
    message = store.add_message(cid, "user", "hello " * 500)  # room for ~6,000 tokens: the file's size passes
    path = index_path(tmp_path / "history", "pair")
    path.parent.mkdir()
    count = 1 << 22
    np.savez_compressed(
        path,
        version=np.int64(1),
        message_ids=np.array([message], np.int64),
        offsets=np.array([0, count], np.int64),
        tokens=np.zeros(count, np.int32),
    )
    assert path.stat().st_size < 100_000
    tracemalloc.start()
    try:
        history = PairHistory(store, "pair", lambda text: [1, 2, 3], tmp_path / "history", vocab_size=100)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20  # inflated: 16 MB of int32, ~150 MB as Python ints in the index
    assert history.rebuilt and len(history.index) == 1
    assert "its tokens would take 16777344 bytes, more than its messages can hold" in history.problems[0]
    assert PairHistory(store, "pair", lambda text: [1, 2, 3], tmp_path / "history", vocab_size=100).problems == []
