"""Versions of messages: editing any user message or regenerating any answer makes a new version, the old one is kept
with what followed it, ‹ n/N › switches between them, and the store (schema v6) saves, reloads and exports them all.
The handlers run in-process on the echo session (it answers with the user's own message) with a real store."""

from __future__ import annotations

import json
import sqlite3

import pytest

from localspec.store.db import ConversationStore
from localspec.store.schema import SCHEMA_VERSION, migrate
from localspec.ui.actions import Actions
from localspec.ui.echo import echo_manager
from localspec.ui.handlers import Handlers
from localspec.ui.recorder import Recorder, turns_from_conversation
from localspec.ui.render import transcript_html
from localspec.ui.versions import version_of

from .test_actions import SETTINGS, last


def token(i: int) -> dict:
    return {"id": i, "text": f"t{i} ", "kind": "accepted", "p_target": 0.5, "p_draft": 0.25}


def shape(turns: list[dict]) -> list:
    """What a person sees and can reach: each turn's role and text, with its other versions (nested)."""
    out = []
    for turn in turns:
        versions = turn.get("versions") or {}
        out.append(
            (
                turn["role"],
                turn["content"],
                [shape(b) for b in versions.get("before", [])],
                [shape(a) for a in versions.get("after", [])],
            )
        )
    return out


def texts(turns: list[dict]) -> list[str]:
    return [t["content"] for t in turns]


# ---- the store --------------------------------------------------------------------------------------------------


def test_a_v5_database_migrates_to_v6_keeping_every_conversation(tmp_path):
    path = tmp_path / "conversations.db"
    conn = sqlite3.connect(path, isolation_level=None)
    migrate(conn, target_version=5)
    conn.execute(
        "INSERT INTO conversations (id, title, model, created_at, updated_at, system_prompt) VALUES "
        "(1, 'first', 'm', 1, 2, 'Be brief.'), (2, 'second', 'm', 3, 4, NULL)"
    )
    rows = [(1, 1, "user", "q1"), (2, 1, "assistant", "a1"), (3, 2, "user", "other"), (4, 1, "user", "q2")]
    rows += [(5, 1, "assistant", "a2"), (6, 2, "assistant", "other answer")]
    for mid, cid, role, content in rows:
        conn.execute(
            "INSERT INTO messages (id, conversation_id, role, content, complete, created_at, stats) "
            "VALUES (?, ?, ?, ?, 1, ?, ?)",
            (mid, cid, role, content, mid, json.dumps({"tokens": mid}) if role == "assistant" else None),
        )
    conn.execute(
        "INSERT INTO tokens (message_id, seq, token_id, text, kind, p_target) VALUES (5, 0, 9, 'a2', 'resampled', 0.3)"
    )
    conn.execute("INSERT INTO settings (key, value) VALUES ('default_system_prompt', 'Hi.')")
    conn.close()
    with ConversationStore(path) as store:
        assert store.schema_version == SCHEMA_VERSION == 6 and store.recovered_from is None
        first, second = store.get_conversation(1), store.get_conversation(2)
        assert [(m.role, m.content) for m in first.messages] == [
            ("user", "q1"),
            ("assistant", "a1"),
            ("user", "q2"),
            ("assistant", "a2"),
        ]
        assert texts_of(second) == ["other", "other answer"] and first.system_prompt == "Be brief."
        assert first.messages[3].stats == {"tokens": 5} and first.messages[3].tokens[0]["kind"] == "resampled"
        assert all(first.versions_of(m) == (m,) for m in first.messages)  # one chain: one version each
        assert store.path_ids(1) == [1, 2, 4, 5] and store.get_setting("default_system_prompt") == "Hi."
        added = store.add_message(1, "user", "q3")  # a new message follows the last one shown
        assert store.path_ids(1) == [1, 2, 4, 5, added]


def texts_of(conversation) -> list[str]:
    return [m.content for m in conversation.messages]


def test_versions_are_saved_reloaded_and_switching_persists(tmp_path):
    path = tmp_path / "c.db"
    with ConversationStore(path) as store:
        cid = store.create_conversation("t", "m")
        q1, a1 = store.add_message(cid, "user", "q1"), store.add_message(cid, "assistant", "a1")
        q2, a2 = store.add_message(cid, "user", "q2"), store.add_message(cid, "assistant", "a2")
        q2b = store.add_message(cid, "user", "q2 edited", parent=a1)  # an edit of q2: a new version
        a2b = store.start_answer(cid, "m", "ngram", 3, parent=q2b)
        store.append_tokens(a2b, [token(1), token(2)])
        store.finish_answer(a2b, "stop", {"tokens": 2})
        a1b = store.add_message(cid, "assistant", "a1 again", parent=q1)  # a regenerated a1: a new version
    with ConversationStore(path) as store:
        conv = store.get_conversation(cid)
        assert texts_of(conv) == ["q1", "a1 again"]
        assert [m.id for m in conv.versions_of(conv.messages[1])] == [a1, a1b]
        assert store.switch_version(cid, 1, -1) == a1  # back to a1: the path below it is the one last shown there
    with ConversationStore(path) as store:
        conv = store.get_conversation(cid)
        assert texts_of(conv) == ["q1", "a1", "q2 edited", "t1 t2 "]
        assert [m.id for m in conv.versions_of(conv.messages[2])] == [q2, q2b]
        assert [t["id"] for t in conv.messages[3].tokens] == [1, 2]  # a kept version keeps its provenance
        assert store.switch_version(cid, 2, -1) == q2 and store.path_ids(cid) == [q1, a1, q2, a2]
        assert store.switch_version(cid, 2, -1) is None and store.switch_version(cid, 9, 1) is None
    with ConversationStore(path) as store:
        assert store.path_ids(cid) == [q1, a1, q2, a2]
        assert len(store.get_conversation(cid).every) == 7


def test_taking_back_a_new_version_shows_the_one_before_again(tmp_path):
    with ConversationStore(tmp_path / "c.db") as store:
        cid = store.create_conversation("t", "m")
        q1 = store.add_message(cid, "user", "q1")
        a1 = store.add_message(cid, "assistant", "a1")
        q2, a2 = store.add_message(cid, "user", "q2"), store.add_message(cid, "assistant", "a2")
        q1b = store.add_message(cid, "user", "q1 edited", parent=None)
        a1b = store.start_answer(cid, "m", "ngram", 3, parent=q1b)
        assert store.path_ids(cid) == [q1b, a1b]
        assert store.retract_exchange(q1b, a1b) is False  # the answer failed before its first token
        assert store.path_ids(cid) == [q1, a1, q2, a2]


def test_the_export_holds_every_version_and_marks_the_shown_one(tmp_path):
    with ConversationStore(tmp_path / "c.db") as store:
        cid = store.create_conversation("t", "m")
        q1 = store.add_message(cid, "user", "q1")
        store.add_message(cid, "assistant", "first answer")
        second = store.add_message(cid, "assistant", "second answer", parent=q1)
        doc = store.export_dict(cid)
        assert [(m["content"], m["version"], m["versions"]) for m in doc["messages"]] == [
            ("q1", 1, 1),
            ("second answer", 2, 2),
        ]
        (other,) = doc["other_versions"]
        assert (other["content"], other["version"], other["parent_id"]) == ("first answer", 1, q1)
        assert doc["messages"][1]["id"] == second and json.loads(store.export_json(cid))["other_versions"]
        markdown = store.export_markdown(cid)
        assert "## Assistant (version 2 of 2" in markdown and "second answer" in markdown
        assert "## Other versions (not shown)" in markdown
        assert "### Assistant (message 2; version 1 of 2" in markdown and "first answer" in markdown


# ---- the window's handlers --------------------------------------------------------------------------------------


@pytest.fixture
def app(tmp_path):
    store = ConversationStore(tmp_path / "conversations.db")
    handlers = Handlers(echo_manager(), Recorder(store))
    yield handlers, Actions(handlers), store
    store.close()


def send(handlers, text, turns):
    *_, box, turns = last(handlers.send(text, turns, *SETTINGS))
    return turns


def stored(handlers, store) -> list[dict]:
    return turns_from_conversation(store.get_conversation(handlers.recorder.conversation_of("local")))


def test_editing_message_1_of_3_starts_a_new_branch_and_keeps_the_old_one(app):
    handlers, actions, store = app
    turns = []
    for text in ("one", "two", "three"):
        turns = send(handlers, text, turns)
    seen = []
    answer = handlers.manager.answer

    def spy(history, *args, **kwargs):
        seen.append([m["content"] for m in history])
        return answer(history, *args, **kwargs)

    handlers.manager.answer = spy
    _transcript, _status, box, kept, editing, _cancel = actions.edit(turns, None, True, 0)
    assert box == "one" and kept == [] and editing["at"] == 0
    turns = send(handlers, "one, edited", kept)
    assert seen == [["one, edited"]]  # the model is given the new branch only
    assert texts(turns) == ["one, edited", "one, edited"] and version_of(turns[0]) == (2, 2)
    assert shape(stored(handlers, store)) == shape(turns)  # the store keeps what the window shows
    _t, _s, _status, _e, old = actions.switch_version(turns, None, True, 0, -1)
    assert texts(old) == ["one", "one", "two", "two", "three", "three"] and version_of(old[0]) == (1, 2)
    assert shape(stored(handlers, store)) == shape(old)  # switching is saved
    turns = send(handlers, "four", old)  # Send continues the branch shown
    assert texts(turns)[-2:] == ["four", "four"] and seen[-1] == texts(old) + ["four"]
    _t, _s, _status, _e, back = actions.switch_version(turns, None, True, 0, 1)
    assert texts(back) == ["one, edited", "one, edited"] and shape(stored(handlers, store)) == shape(back)
    _t, _s, _status, _e, again = actions.switch_version(back, None, True, 0, -1)
    assert texts(again)[-2:] == ["four", "four"]  # the old branch comes back as it was last shown


def test_editing_a_middle_message_keeps_the_later_turns_with_the_old_version(app):
    handlers, actions, store = app
    turns = []
    for text in ("one", "two", "three"):
        turns = send(handlers, text, turns)
    *_, kept, _editing, _cancel = actions.edit(turns, None, True, 2)
    turns = send(handlers, "two, edited", kept)
    assert texts(turns) == ["one", "one", "two, edited", "two, edited"]
    _t, _s, _status, _e, old = actions.switch_version(turns, None, True, 2, -1)
    assert texts(old) == ["one", "one", "two", "two", "three", "three"]
    reopened = turns_from_conversation(store.get_conversation(handlers.recorder.conversation_of("local")))
    assert shape(reopened) == shape(old)


def test_regenerating_an_earlier_answer_keeps_every_version_with_its_provenance(app):
    handlers, actions, store = app
    turns = send(handlers, "first question", [])
    turns = send(handlers, "second question", turns)
    shorter = SETTINGS[:5] + (2,) + SETTINGS[6:]  # max new tokens 2: the new version differs
    *_, status, _events, turns = last(actions.regenerate(turns, None, *shorter, index=1))
    assert "Done: 2 tokens" in status and len(turns) == 2 and version_of(turns[1]) == (2, 2)
    assert len(turns[1]["tokens"]) == 2
    _t, _s, _status, _e, old = actions.switch_version(turns, None, True, 1, -1)
    assert texts(old) == ["first question", "first question", "second question", "second question"]
    assert [t["text"] for t in old[1]["tokens"]] and old[1]["tokens"][0]["kind"]  # its token records are kept
    reopened = stored(handlers, store)
    assert shape(reopened) == shape(old)
    assert [t["id"] for t in reopened[1]["tokens"]] == [t["id"] for t in old[1]["tokens"]]
    html = transcript_html(old, True)
    assert 'data-ls-action="switch"' in html and "1/2" in html


def test_switching_is_refused_while_editing_and_where_there_is_no_other_version(app):
    handlers, actions, _store = app
    turns = send(handlers, "hello", [])
    *_, status, _events, same = actions.switch_version(turns, None, True, 0, 1)
    assert "no other version" in status and same == turns
    for index, step in ((float("nan"), 1), (float("inf"), -1), (-3, 1), (0, float("nan")), ("0", 1)):
        *_, status, _events, same = actions.switch_version(turns, None, True, index, step)
        assert "no other version" in status and same == turns
    *_, kept, editing, _cancel = actions.edit(turns, None, True, 0)
    *_, status, _events, _same = actions.switch_version(kept, editing, True, 0, 1)
    assert "finish the edit first" in status
    _t, status, *_ = actions.edit(turns, None, True, 1)  # an answer is not a message to edit
    assert "no such message" in status


def test_a_hand_edited_cycle_of_parents_neither_hangs_nor_loses_the_rest(tmp_path):
    path = tmp_path / "c.db"
    with ConversationStore(path) as store:
        cid = store.create_conversation("t", "m")
        q1, a1 = store.add_message(cid, "user", "q1"), store.add_message(cid, "assistant", "a1")
        q2, a2 = store.add_message(cid, "user", "q2"), store.add_message(cid, "assistant", "a2")
    with sqlite3.connect(path) as raw:
        raw.execute("UPDATE messages SET parent_id = ? WHERE id = ?", (a2, q2))  # q2 → a2 → q2
    with ConversationStore(path) as store:
        conv = store.get_conversation(cid)
        assert texts_of(conv) == ["q1", "a1"] and len(conv.every) == 4
        assert [m["content"] for m in store.export_dict(cid)["other_versions"]] == ["q2", "a2"]
        assert "q2" in store.export_markdown(cid)
        store.add_message(cid, "assistant", "in the loop", parent=q2)  # marks it and its "ancestors" shown
        store.add_message(cid, "user", "q3", parent=a1)
        assert store.path_ids(cid)[:2] == [q1, a1] and texts_of(store.get_conversation(cid))[-1] == "q3"
