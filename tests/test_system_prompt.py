"""The system prompt (localspec/ui/system_prompt.py): saved with each conversation (schema 5, old files still open),
a default for new chats, given to the model as the first message by Send, Regenerate and Compare. The handlers run
in-process on an echo session that says back the system message it was given."""

from __future__ import annotations

import sqlite3

import pytest

from localspec.store.db import ConversationStore
from localspec.store.schema import SCHEMA_VERSION, migrate
from localspec.ui.actions import Actions
from localspec.ui.conversations import ConversationHandlers
from localspec.ui.echo import ECHO_PAIR, EchoSession
from localspec.ui.handlers import Handlers
from localspec.ui.manager import ModelManager
from localspec.ui.recorder import Recorder

SETTINGS = ("ngram", 3, 0.0, 1.0, 0, 64, 0, True, 0, False)  # ... tree nodes, keep speculating
ASK = "which system prompt"  # answered with the system message the model was given


class SystemEcho(EchoSession):
    """Echo, except that ASK is answered with the system message it was given (or "none")."""

    def __init__(self) -> None:
        super().__init__()
        self.given: list[list[dict]] = []

    def prompt_ids(self, messages, max_new_tokens, truncate=True, cancel=None):
        ids, notice = super().prompt_ids(messages, max_new_tokens, truncate, cancel)
        self.given.append([dict(m) for m in messages])
        if self._text == ASK:
            systems = [m["content"] for m in messages if m["role"] == "system"]
            self._text = f"system: {systems[0] if systems else 'none'}"
        return ids, notice


def last(generator):
    out = None
    for out in generator:  # noqa: B007 - the last value is the point
        pass
    return out


@pytest.fixture
def app(tmp_path):
    session = SystemEcho()
    manager = ModelManager([ECHO_PAIR], lambda _pair, _progress: session)
    manager.load("echo")
    store = ConversationStore(tmp_path / "conversations.db")
    recorder = Recorder(store)
    handlers = Handlers(manager, recorder)
    yield handlers, Actions(handlers), ConversationHandlers(store, recorder, manager), store, session
    store.close()


def send(handlers, text, turns, system):
    return last(handlers.send(text, list(turns), *SETTINGS, system))[-1]


def test_send_gives_the_system_prompt_first_and_saves_it_with_the_conversation(app):
    handlers, _actions, panel, store, session = app
    turns = send(handlers, ASK, [], "Answer like a pirate.")
    assert session.given[-1][0] == {"role": "system", "content": "Answer like a pirate."}
    assert turns[-1]["content"] == "system: Answer like a pirate."
    assert turns[-1]["tokens"]  # the answer's token records (the provenance card) are there as ever
    (summary,) = store.list_conversations()
    conversation = store.get_conversation(summary.id)
    assert conversation.system_prompt == "Answer like a pirate."
    assert conversation.chat_messages()[0] == {"role": "system", "content": "Answer like a pirate."}
    assert [m.role for m in conversation.messages] == ["user", "assistant"]  # not a message of its own

    # a changed prompt is what the next answers get, and what the conversation keeps
    turns = send(handlers, ASK, turns, "Answer in French.")
    assert turns[-1]["content"] == "system: Answer in French."
    assert store.get_conversation(summary.id).system_prompt == "Answer in French."

    handlers.clear()
    *_, opened_turns, title, system = panel.open(summary.id, True)
    assert system == "Answer in French." and title == ASK and len(opened_turns) == 4


def test_an_empty_system_prompt_gives_none(app):
    handlers, *_rest, session = app
    turns = send(handlers, ASK, [], "   ")
    assert all(m["role"] != "system" for m in session.given[-1])
    assert turns[-1]["content"] == "system: none"


def test_regenerate_and_compare_give_the_system_prompt(app):
    handlers, actions, _panel, _store, session = app
    turns = send(handlers, ASK, [], "Be brief.")
    *_, turns = last(actions.regenerate(turns, None, *SETTINGS, "Be verbose."))
    assert turns[-1]["content"] == "system: Be verbose."  # the box as it is now
    compare_panel, status = last(handlers.compare(turns))
    assert "Baseline done" in status
    assert session.given[-1][0] == {"role": "system", "content": "Be verbose."}  # what the compared answer got
    assert "bitwise identical" in compare_panel  # the baseline said what the answer said


def test_the_default_is_saved_and_starts_each_new_chat(app, tmp_path):
    handlers, _actions, panel, store, _session = app
    assert handlers.system_prompts.default() == ""
    assert "Saved" in handlers.system_prompts.save_default("You are terse.")
    assert handlers.clear()[-1] == "You are terse."  # Clear and New chat start from the default
    turns = send(handlers, "to be deleted", [], "own prompt")
    (summary,) = store.list_conversations()
    panel.open(summary.id, True)
    *_head, system = panel.delete_with_undo(summary.id, "")
    assert system == "You are terse."  # the open conversation went: a new chat, with the default
    assert turns
    with ConversationStore(tmp_path / "conversations.db") as again:  # the next start reads it
        assert Handlers(handlers.manager, Recorder(again)).system_prompts.default() == "You are terse."


def test_a_schema_4_database_opens_with_no_system_prompts(tmp_path):
    path = tmp_path / "conversations.db"
    conn = sqlite3.connect(path, isolation_level=None)
    migrate(conn, target_version=4)
    conn.execute("INSERT INTO conversations (id, title, model, created_at, updated_at) VALUES (1, 'old', 'm', 1, 2)")
    conn.execute(
        "INSERT INTO messages (conversation_id, role, content, complete, created_at) VALUES (1, 'user', 'hi', 1, 1)"
    )
    conn.close()
    with ConversationStore(path) as store:
        assert store.schema_version == SCHEMA_VERSION
        old = store.get_conversation(1)
        assert old.system_prompt is None and old.chat_messages() == [{"role": "user", "content": "hi"}]
        assert store.get_setting("default_system_prompt") is None
        store.set_system_prompt(1, "from now on")
        assert store.get_conversation(1).chat_messages()[0]["content"] == "from now on"
        assert store.export_dict(1)["system_prompt"] == "from now on"
        assert "## System prompt\n\nfrom now on" in store.export_markdown(1)
