"""The conversation store: round trips, streaming writes, crash safety, threads, migration, corrupt-file recovery."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from localspec.config import ConfigError
from localspec.store.db import ConversationStore, StoreError, default_path
from localspec.store.schema import SCHEMA_VERSION, V1, migrate

REPO = Path(__file__).resolve().parents[1]
KINDS = ("accepted", "resampled", "bonus", "target")


def token(i: int, kind: str = "accepted", text: str | None = None) -> dict:
    return {
        "id": i,
        "text": text if text is not None else f"t{i} ",
        "kind": kind,
        "p_target": 0.5 + i / 1000,
        "p_draft": 0.25 if kind == "accepted" else None,
        "rejected_id": 7 if kind == "resampled" else None,
        "rejected_p_target": 0.1 if kind == "resampled" else None,
        "rejected_p_draft": 0.9 if kind == "resampled" else None,
    }


@pytest.fixture
def store(tmp_path):
    with ConversationStore(tmp_path / "conversations.db") as s:
        yield s


def test_default_path_follows_localspec_home(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path / "elsewhere"))
    assert default_path() == tmp_path / "elsewhere" / "conversations.db"
    with ConversationStore() as s:
        assert s.path == tmp_path / "elsewhere" / "conversations.db"
        s.create_conversation("hello", "m")
    assert (tmp_path / "elsewhere" / "conversations.db").exists()


def test_wal_mode_and_schema_version(store):
    assert store.journal_mode == "wal"
    assert store.schema_version == SCHEMA_VERSION == 6
    raw = sqlite3.connect(store.path)
    assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"  # persistent: a second reader sees it too
    raw.close()


def test_conversation_round_trip(store):
    cid = store.create_conversation("First chat", "tiny")
    store.add_message(cid, "system", "Be brief.")
    store.add_message(cid, "user", "Hi there")
    mid = store.start_answer(cid, "tiny-target", "draft", 3)
    step1 = [token(10, "accepted", "Hel"), token(11, "resampled", "lo")]
    step2 = [token(12, "bonus", "!")]
    store.append_tokens(mid, step1)
    store.append_tokens(mid, step2)
    stats = {"acceptance_rate": 0.5, "mean_acceptance_length": 1.5, "per_position_acceptance": [0.5, 0.0]}
    store.finish_answer(mid, "stop", stats)

    conv = store.get_conversation(cid)
    assert (conv.title, conv.model) == ("First chat", "tiny")
    assert [m.role for m in conv.messages] == ["system", "user", "assistant"]
    answer = conv.messages[-1]
    assert answer.content == "Hello!"
    assert answer.complete and answer.finish_reason == "stop"
    assert (answer.model, answer.proposer, answer.k) == ("tiny-target", "draft", 3)
    assert answer.stats == stats
    assert list(answer.tokens) == step1 + step2
    assert answer.token_kinds == ["accepted", "resampled", "bonus"]
    assert conv.chat_messages()[1] == {"role": "user", "content": "Hi there"}
    assert not conv.incomplete


def test_list_is_newest_first_and_flags_incomplete(store):
    a = store.create_conversation("a", "m")
    b = store.create_conversation("b", "m")
    mid = store.start_answer(b, "m", "ngram", 4)
    assert [s.id for s in store.list_conversations()] == [b, a]
    assert {s.id: s.incomplete for s in store.list_conversations()} == {a: False, b: True}
    store.add_message(a, "user", "later")  # activity moves a to the top
    assert [s.id for s in store.list_conversations()] == [a, b]
    store.finish_answer(mid, "cancelled", {})
    assert not any(s.incomplete for s in store.list_conversations())
    assert store.get_conversation(b).messages[0].finish_reason == "cancelled"


def test_rename_and_delete(store):
    cid = store.create_conversation("old", "m")
    store.add_message(cid, "user", "x")
    mid = store.start_answer(cid, "m", "none", 1)
    store.append_tokens(mid, [token(1, "target")])
    store.rename_conversation(cid, "new name")
    assert store.get_conversation(cid).title == "new name"
    store.delete_conversation(cid)
    assert store.list_conversations() == []
    with pytest.raises(StoreError, match="does not exist"):
        store.get_conversation(cid)
    with sqlite3.connect(store.path) as raw:  # cascades: nothing orphaned
        assert raw.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 0
        assert raw.execute("SELECT COUNT(*) FROM tokens").fetchone()[0] == 0
    store.delete_conversation(cid)  # already gone: no error


def test_deleted_mid_answer_drops_tokens_quietly(store):
    """Another tab deletes the conversation while this one streams: the stream's writes become no-ops."""
    cid = store.create_conversation("t", "m")
    mid = store.start_answer(cid, "m", "ngram", 2)
    assert store.append_tokens(mid, [token(1)]) is True
    store.delete_conversation(cid)
    assert store.append_tokens(mid, [token(2)]) is False
    assert store.finish_answer(mid, "stop", {}) is False


def test_unknown_ids_and_bad_arguments_raise_store_errors(store):
    cid = store.create_conversation("t", "m")
    for call in (
        lambda: store.add_message(999, "user", "x"),
        lambda: store.start_answer(999, "m", "ngram", 2),
        lambda: store.rename_conversation(999, "x"),
        lambda: store.export_json(999),
        lambda: store.get_conversation("not an id"),
    ):
        with pytest.raises(StoreError, match="does not exist"):
            call()
    with pytest.raises(StoreError, match="role"):
        store.add_message(cid, "robot", "x")
    with pytest.raises(ConfigError, match="must be text"):
        store.add_message(cid, "user", None)
    user_msg = store.add_message(cid, "user", "x")
    with pytest.raises(StoreError, match="not an answer in progress"):
        store.append_tokens(user_msg, [token(1)])
    mid = store.start_answer(cid, "m", "ngram", 2)
    with pytest.raises(StoreError, match="integer 'id'"):
        store.append_tokens(mid, [{"text": "no id"}])
    store.finish_answer(mid, "stop", {})
    with pytest.raises(StoreError, match="not an answer in progress"):
        store.append_tokens(mid, [token(1)])
    # the store is still usable after every refusal, and nothing half-written is left
    assert [m.role for m in store.get_conversation(cid).messages] == ["user", "assistant"]
    assert store.get_conversation(cid).messages[1].tokens == ()


def test_titles_and_content_stored_as_given(store):
    nasty = '<script>alert("x")</script> & <b>bold</b> `code` # not a heading \x00\x07 \u202e ünïcödé 🙂'
    cid = store.create_conversation(nasty, "<img src=x onerror=alert(1)>")
    store.add_message(cid, "user", nasty)
    conv = store.get_conversation(cid)
    assert conv.title == nasty and conv.messages[0].content == nasty
    assert store.list_conversations()[0].title == nasty
    exported = json.loads(store.export_json(cid))
    assert exported["title"] == nasty and exported["messages"][0]["content"] == nasty
    md = store.export_markdown(cid)
    assert isinstance(md, str)
    assert md.startswith(f"# {nasty}\n")  # text, unchanged: escaping is the renderer's job
    assert nasty in md


def test_empty_title_gets_a_placeholder_and_lone_surrogates_are_replaced(store):
    cid = store.create_conversation("   ", "m")
    assert store.get_conversation(cid).title == "Untitled conversation"
    store.add_message(cid, "user", "bad \ud800 half")
    assert store.get_conversation(cid).messages[0].content == "bad \ufffd half"


def test_export_json_and_markdown(store):
    cid = store.create_conversation("Export me", "tiny")
    store.add_message(cid, "user", "Question?")
    mid = store.start_answer(cid, "tiny", "draft", 3)
    store.append_tokens(mid, [token(1, "accepted", "Ans"), token(2, "bonus", "wer")])
    store.finish_answer(mid, "length", {"acceptance_rate": float("nan"), "emitted": 2})
    cid2 = store.create_conversation("Half", "tiny")
    mid2 = store.start_answer(cid2, "tiny", "ngram", 4)
    store.append_tokens(mid2, [token(3, "target", "Part")])

    doc = json.loads(store.export_json(cid))  # strict JSON: NaN became null
    assert doc["format"] == "localspec-conversation" and doc["schema_version"] == SCHEMA_VERSION
    assert doc["title"] == "Export me"
    assert [m["role"] for m in doc["messages"]] == ["user", "assistant"]
    answer = doc["messages"][1]
    assert answer["content"] == "Answer" and answer["finish_reason"] == "length"
    assert [t["kind"] for t in answer["tokens"]] == ["accepted", "bonus"]
    assert answer["stats"] == {"acceptance_rate": None, "emitted": 2}

    md = store.export_markdown(cid)
    assert md.index("## User") < md.index("Question?") < md.index("## Assistant") < md.index("Answer")
    assert "incomplete" not in md
    assert "incomplete" in store.export_markdown(cid2) and "Part" in store.export_markdown(cid2)


def test_an_answer_keeps_its_tree_size_and_reopens_with_it(store):
    from localspec.ui.recorder import turns_from_conversation

    cid = store.create_conversation("Trees", "tiny")
    store.add_message(cid, "user", "Question?")
    trees = store.start_answer(cid, "tiny", "ngram+head", 4, tree_nodes=8)
    store.append_tokens(trees, [token(1, "accepted", "Ans")])
    store.finish_answer(trees, "stop", {"emitted": 1})
    store.add_message(cid, "user", "Again?")
    chain = store.start_answer(cid, "tiny", "ngram", 3)
    store.finish_answer(chain, "stop", {"emitted": 0})
    answers = [m for m in store.get_conversation(cid).messages if m.role == "assistant"]
    assert [(m.k, m.tree_nodes) for m in answers] == [(4, 8), (3, None)]
    assert [m["tree_nodes"] for m in store.export_dict(cid)["messages"] if m["role"] == "assistant"] == [8, None]
    md = store.export_markdown(cid)
    assert "proposer ngram+head, tree 8" in md and "proposer ngram, K=3" in md
    labels = [t["label"] for t in turns_from_conversation(store.get_conversation(cid)) if t["role"] == "assistant"]
    assert labels == ["tiny · n-gram, else head · tree 8", "tiny · n-gram · K=3"]


def test_reopen_keeps_everything(tmp_path):
    path = tmp_path / "c.db"
    with ConversationStore(path) as s:
        cid = s.create_conversation("keep", "m")
        mid = s.start_answer(cid, "m", "ngram", 2)
        s.append_tokens(mid, [token(1, "accepted"), token(2, "bonus")])
    with ConversationStore(path) as s:
        assert s.recovered_from is None
        answer = s.get_conversation(cid).messages[0]
        assert not answer.complete and answer.token_kinds == ["accepted", "bonus"]


KILL_SCRIPT = textwrap.dedent("""
    import os, signal, sys
    from localspec.store.db import ConversationStore
    store = ConversationStore(sys.argv[1])
    cid = store.create_conversation("killed", "tiny")
    store.add_message(cid, "user", "tell me a story")
    mid = store.start_answer(cid, "tiny", "draft", 3)
    kinds = ["accepted", "accepted", "resampled"]
    step = 0
    while True:
        store.append_tokens(mid, [{"id": step * 3 + i, "text": f"{step}.{i} ", "kind": kinds[i],
                                   "p_target": 0.5, "p_draft": 0.5, "rejected_id": None} for i in range(3)])
        step += 1
        print(step, flush=True)
        if step == int(sys.argv[2]):
            # a step in flight: half of its rows written inside an open transaction, then kill -9, no cleanup
            store._conn.execute("BEGIN IMMEDIATE")
            store._conn.execute("INSERT INTO tokens (message_id, seq, token_id, text, kind) "
                                "VALUES (?, ?, 999, 'half', 'accepted')", (mid, step * 3))
            os.kill(os.getpid(), signal.SIGKILL)
""")


@pytest.mark.slow  # a subprocess
@pytest.mark.parametrize("killer", ["self", "parent"])
def test_killed_process_leaves_the_partial_answer_marked_incomplete(tmp_path, killer):
    path = tmp_path / "conversations.db"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    kill_at = 6 if killer == "self" else 10**9
    proc = subprocess.Popen(
        [sys.executable, "-c", KILL_SCRIPT, str(path), str(kill_at)], env=env, stdout=subprocess.PIPE, text=True
    )
    committed = 0
    try:
        for line in proc.stdout:  # each line = one step committed
            committed = int(line)
            if killer == "parent" and committed >= 6:
                proc.send_signal(signal.SIGKILL)  # the step after it may be in flight
                break
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert committed >= 6

    with ConversationStore(path) as store:
        assert store.recovered_from is None
        (summary,) = store.list_conversations()
        assert summary.incomplete
        conv = store.get_conversation(summary.id)
        user, answer = conv.messages
        assert user.content == "tell me a story" and user.complete
        assert not answer.complete and answer.finish_reason is None
        steps = len(answer.tokens) // 3
        assert len(answer.tokens) % 3 == 0  # never half a step
        if killer == "self":
            assert steps == kill_at  # every committed step is there; the one in flight is gone
        else:
            assert steps >= committed  # every step the child reported committed survived
        assert 999 not in [t["id"] for t in answer.tokens]
        assert answer.token_kinds == ["accepted", "accepted", "resampled"] * steps
        assert answer.content == "".join(f"{s}.{i} " for s in range(steps) for i in range(3))
        # the answer can still be closed later (e.g. the UI marks it 'interrupted'), and the store works on
        store.finish_answer(answer.id, "interrupted", {})
        assert not store.list_conversations()[0].incomplete


def test_two_threads_two_conversations_no_interleaving(store):
    steps, per_step = 60, 3
    ids = {}
    errors = []
    barrier = threading.Barrier(2)

    def stream(name: str) -> None:
        try:
            cid = store.create_conversation(name, "m")
            store.add_message(cid, "user", f"question {name}")
            mid = store.start_answer(cid, "m", "ngram", per_step)
            ids[name] = cid
            barrier.wait()
            for s in range(steps):
                store.append_tokens(
                    mid, [token(s * per_step + i, KINDS[i % 4], f"{name}{s}.{i}|") for i in range(per_step)]
                )
            store.finish_answer(mid, "length", {"emitted": steps * per_step})
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=stream, args=(n,)) for n in ("A", "B")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    for name in ("A", "B"):
        conv = store.get_conversation(ids[name])
        answer = conv.messages[-1]
        expected = [f"{name}{s}.{i}|" for s in range(steps) for i in range(per_step)]
        assert [t["text"] for t in answer.tokens] == expected
        assert answer.content == "".join(expected)
        assert [t["id"] for t in answer.tokens] == list(range(steps * per_step))
        assert answer.complete


def test_two_store_objects_on_one_file_share_it(tmp_path):
    """Two connections (e.g. the app and a CLI export) at once: WAL lets both work, busy_timeout queues writers."""
    path = tmp_path / "c.db"
    a, b = ConversationStore(path), ConversationStore(path)
    try:
        cid_a = a.create_conversation("from a", "m")
        mid = a.start_answer(cid_a, "m", "ngram", 1)
        done = []

        def writer(s, tag):
            for i in range(40):
                s.add_message(cid_a, "user", f"{tag}{i}")
            done.append(tag)

        threads = [threading.Thread(target=writer, args=(s, tag)) for s, tag in ((a, "a"), (b, "b"))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert sorted(done) == ["a", "b"]
        a.append_tokens(mid, [token(1)])
        contents = [m.content for m in b.get_conversation(cid_a).messages]
        assert sorted(c for c in contents if c.startswith("a")) == sorted(f"a{i}" for i in range(40))
        assert sum(c.startswith("b") for c in contents) == 40
    finally:
        a.close()
        b.close()


def _write_v1_database(path: Path) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    migrate(conn, target_version=1)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 1
    conn.execute(
        "INSERT INTO conversations (id, title, model, created_at, updated_at) "
        "VALUES (1, 'from v1', 'old-model', 1000.0, 2000.0)"
    )
    conn.execute(
        "INSERT INTO messages (id, conversation_id, role, content, complete, created_at) "
        "VALUES (1, 1, 'user', 'old question', 1, 1000.0)"
    )
    conn.execute(
        "INSERT INTO messages (id, conversation_id, role, content, complete, model, proposer, k, "
        "created_at) VALUES (2, 1, 'assistant', 'old ans', 0, 'old-model', 'ngram', 4, 1001.0)"
    )
    conn.execute(
        "INSERT INTO tokens (message_id, seq, token_id, text, kind, p_target, p_draft, rejected_id) "
        "VALUES (2, 0, 5, 'old ', 'accepted', 0.9, 1.0, NULL), (2, 1, 6, 'ans', 'resampled', 0.4, NULL, 9)"
    )
    conn.close()


def test_v1_schema_statements_are_frozen():
    """Migrations must start from what version 1 really was: changing V1 would break old files."""
    assert len(V1) == 3 and all(s.startswith("CREATE TABLE") for s in V1)
    assert "error" not in V1[1] and "extra" not in V1[2]


def test_migration_from_v1(tmp_path):
    path = tmp_path / "conversations.db"
    _write_v1_database(path)
    with sqlite3.connect(path) as raw:
        assert "error" not in [r[1] for r in raw.execute("PRAGMA table_info(messages)")]
    with ConversationStore(path) as store:
        assert store.schema_version == SCHEMA_VERSION and store.recovered_from is None
        (summary,) = store.list_conversations()
        assert (summary.title, summary.model, summary.incomplete) == ("from v1", "old-model", True)
        user, answer = store.get_conversation(1).messages
        assert user.content == "old question"
        assert answer.content == "old ans" and answer.token_kinds == ["accepted", "resampled"]
        assert answer.k == 4 and answer.tree_nodes is None  # saved before trees: a chain of K
        assert answer.tokens[1]["rejected_id"] == 9 and answer.tokens[1]["rejected_p_target"] is None
        # v2 columns work on migrated rows
        store.append_tokens(answer.id, [token(7, "bonus", "!")])
        store.finish_answer(answer.id, "error", {}, error="the model produced NaN")
        answer = store.get_conversation(1).messages[1]
        assert answer.content == "old ans!" and answer.error == "the model produced NaN"
        assert answer.tokens[-1]["rejected_p_target"] is None and answer.tokens[-1]["kind"] == "bonus"
    with sqlite3.connect(path) as raw:
        indexes = {r[1] for r in raw.execute("PRAGMA index_list(messages)")}
        assert "messages_by_conversation" in indexes
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_newer_schema_is_refused_not_destroyed(tmp_path):
    path = tmp_path / "conversations.db"
    with ConversationStore(path) as s:
        s.create_conversation("future", "m")
    with sqlite3.connect(path) as raw:
        raw.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 5}")
    with pytest.raises(StoreError, match="newer localspec"):
        ConversationStore(path)
    assert path.exists() and not list(tmp_path.glob("*.corrupt-*"))  # left alone, not moved aside


@pytest.mark.parametrize("damage", ["garbage", "truncated", "zeroed-middle", "header-only"])
def test_corrupt_file_is_moved_aside_and_a_fresh_one_started(tmp_path, damage):
    path = tmp_path / "conversations.db"
    with ConversationStore(path) as s:
        cid = s.create_conversation("doomed", "m")
        for i in range(300):
            s.add_message(cid, "user", f"message {i} " * 40)
    good = path.read_bytes()
    assert len(good) > 100_000
    if damage == "garbage":
        bad = os.urandom(len(good))
    elif damage == "truncated":
        bad = good[: len(good) // 2 + 123]
    elif damage == "zeroed-middle":
        bad = good[:4096] + b"\xff" * (len(good) - 8192) + good[-4096:]
    else:
        bad = good[:100]
    path.write_bytes(bad)

    store = ConversationStore(path)
    try:
        moved = store.recovered_from
        assert moved is not None and moved.exists()
        assert moved.name.startswith("conversations.db.corrupt-")
        assert moved.read_bytes() == bad  # the user's old file is kept byte for byte
        assert store.list_conversations() == []  # fresh start, and it works
        cid = store.create_conversation("fresh", "m")
        assert store.get_conversation(cid).title == "fresh"
    finally:
        store.close()
    with ConversationStore(path) as again:  # the fresh file is healthy: no second recovery
        assert again.recovered_from is None and again.list_conversations()[0].title == "fresh"


def test_another_apps_database_is_refused_not_moved(tmp_path):
    """A healthy SQLite file that is not ours (a clashing table) is an error to report, not corruption."""
    path = tmp_path / "conversations.db"
    with sqlite3.connect(path) as raw:
        raw.execute("CREATE TABLE conversations (something_else TEXT)")
        raw.execute("INSERT INTO conversations VALUES ('keep me')")
    with pytest.raises(StoreError, match="cannot open the conversation database"):
        ConversationStore(path)
    assert not list(tmp_path.glob("*.corrupt-*"))
    with sqlite3.connect(path) as raw:
        assert raw.execute("SELECT * FROM conversations").fetchall() == [("keep me",)]


FIRST_OPEN_ROUNDS = 40  # before the WAL switch waited, 1 round in 25 of 6 openers failed: 40 rounds miss it 1 in 5


def test_many_first_opens_at_once(tmp_path):
    """Several threads opening a new file together, round after round: one creates the schema, none fails (the
    switch to WAL needs a lock SQLite does not wait for by itself)."""
    for round_ in range(FIRST_OPEN_ROUNDS):
        path = tmp_path / f"conversations-{round_}.db"
        stores, errors = [], []

        def open_one(path=path, stores=stores, errors=errors):
            try:
                stores.append(ConversationStore(path))
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=open_one) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        try:
            assert not errors and len(stores) == 6, f"round {round_}: {errors}"
            assert all(s.schema_version == SCHEMA_VERSION and s.recovered_from is None for s in stores)
            cid = stores[0].create_conversation("shared", "m")
            assert stores[5].get_conversation(cid).title == "shared"
        finally:
            for s in stores:
                s.close()


def test_opening_a_healthy_database_leaves_its_shared_memory_file_alone(tmp_path, monkeypatch):
    """Another connection has the -shm mapped: rewriting or unlinking it breaks that connection (SIGBUS)."""
    path = tmp_path / "conversations.db"
    live = ConversationStore(path)
    cid = live.create_conversation("live", "m")
    touched = []
    real_unlink, real_write = Path.unlink, Path.write_bytes

    def unlink(self, missing_ok=False):
        if self.name.endswith("-shm"):
            touched.append(("unlink", self.name))
        return real_unlink(self, missing_ok=missing_ok)

    def write_bytes(self, data):
        if self.name.endswith("-shm"):
            touched.append(("write", self.name))
        return real_write(self, data)

    monkeypatch.setattr(Path, "unlink", unlink)
    monkeypatch.setattr(Path, "write_bytes", write_bytes)
    try:
        with ConversationStore(path) as second:
            assert second.recovered_from is None and second.get_conversation(cid).title == "live"
        assert touched == []
        assert live.get_conversation(cid).title == "live"
    finally:
        live.close()


def test_empty_file_is_a_fresh_database_not_corruption(tmp_path):
    path = tmp_path / "conversations.db"
    path.write_bytes(b"")
    with ConversationStore(path) as s:
        assert s.recovered_from is None and s.schema_version == SCHEMA_VERSION


def test_path_that_is_a_folder_gives_a_clear_error(tmp_path):
    (tmp_path / "conversations.db").mkdir()
    with pytest.raises(StoreError, match="is a folder"):
        ConversationStore(tmp_path / "conversations.db")


def test_streams_real_engine_events(tiny_session, tmp_path):
    """What the UI will do: record each StepEvent's tokens as they arrive; the kinds come back in order."""
    from localspec.config import SamplingParams

    sampling = SamplingParams(temperature=0.8, max_new_tokens=24, seed=3)
    spec = tiny_session.default_spec(proposer="draft", k=3)
    messages = [{"role": "user", "content": "hello tiny model"}]
    with ConversationStore(tmp_path / "c.db") as store:
        cid = store.create_conversation("engine", tiny_session.loaded.spec.name)
        store.add_message(cid, "user", messages[0]["content"])
        mid = store.start_answer(cid, tiny_session.loaded.spec.name, spec.proposer, spec.k)
        seen = []
        final = None
        for event in tiny_session.stream(messages, sampling, spec):
            records = [tok.to_dict() for tok in event.tokens]
            store.append_tokens(mid, records)
            seen.extend(records)
            final = event
        store.finish_answer(mid, final.finish_reason, final.stats.to_dict())
        answer = store.get_conversation(cid).messages[-1]
    assert seen and answer.complete and answer.finish_reason == final.finish_reason
    assert list(answer.tokens) == [json.loads(json.dumps(r)) for r in seen]
    assert answer.content == "".join(r["text"] for r in seen)
    assert set(answer.token_kinds) <= set(KINDS)
    assert answer.stats["emitted"] == len(seen)


def test_the_recorder_stores_an_error_answer(tiny_session, tmp_path):
    """The recorder (the UI's sink, told every Message of an answer) keeps the tokens before a NaN and the error
    that stopped it."""
    import math

    from localspec.config import SamplingParams
    from localspec.ui.manager import Message
    from localspec.ui.recorder import Recorder

    calls = {"n": 0}

    def poison_after_first_step(module, inputs, output):
        calls["n"] += 1
        if calls["n"] > 2:  # prefill + first step are clean
            output = output.clone()
            output[..., 3] = math.nan
        return output

    handle = tiny_session.loaded.target.get_output_embeddings().register_forward_hook(poison_after_first_step)
    try:
        with ConversationStore(tmp_path / "c.db") as store:
            recorder = Recorder(store)
            spec = tiny_session.default_spec(proposer="ngram")
            sink = recorder.sink("tab", "hi")
            sink(Message("started", text="tiny", spec=spec))
            events = list(
                tiny_session.stream([{"role": "user", "content": "hi"}], SamplingParams(max_new_tokens=20), spec)
            )
            for event in events:
                sink(Message("event", event=event, records=tuple(tok.to_dict() for tok in event.tokens)))
            sink(Message("done"))
            answer = store.get_conversation(recorder.conversation_of("tab")).messages[-1]
    finally:
        handle.remove()
    emitted = [tok.token_id for e in events for tok in e.tokens]
    assert events[-1].finish_reason == "error" and emitted  # the clean first step emitted something
    assert answer.complete and answer.finish_reason == "error" and "NaN" in answer.error
    assert [t["id"] for t in answer.tokens] == emitted


def test_system_prompt_saved_with_the_conversation_and_old_rows_have_none(tmp_path):
    path = tmp_path / "c.db"
    with ConversationStore(path) as store:
        old = store.create_conversation("old", "m")
        cid = store.create_conversation("t", "m", system_prompt="Be brief.")
        store.set_setting("default_system_prompt", "Answer in French.")
    with ConversationStore(path) as store:
        conv = store.get_conversation(cid)
        assert conv.system_prompt == "Be brief."
        assert conv.chat_messages()[0] == {"role": "system", "content": "Be brief."}
        assert store.get_conversation(old).chat_messages() == []
        assert store.get_setting("default_system_prompt") == "Answer in French."
        store.set_system_prompt(cid, "")
        assert store.get_conversation(cid).chat_messages() == []
