"""The saved-conversations sidebar (localspec/ui/conversations.py) in-process on the echo session with a real
ConversationStore: full titles, search, rename, delete with undo, export file names."""

from __future__ import annotations

import time

import pytest

from localspec.ui import conversations
from localspec.ui.conversations import ConversationHandlers, file_stem
from localspec.ui.echo import echo_manager
from localspec.ui.handlers import Handlers
from localspec.ui.recorder import Recorder, title_from

store_db = pytest.importorskip("localspec.store.db")

SETTINGS = ("ngram", 3, 0.0, 1.0, 0, 64, 0, True, 0)
LONG_TITLE = "Write a palindrome checker in Python that ignores case, spaces and punctuation, with tests"


@pytest.fixture
def sidebar(tmp_path):
    store = store_db.ConversationStore(tmp_path / "conversations.db")
    recorder = Recorder(store)
    handlers = Handlers(echo_manager(), recorder)
    yield handlers, ConversationHandlers(store, recorder, handlers.manager), store
    store.close()


def send(handlers, text, turns=()):
    out = None
    for out in handlers.send(text, list(turns), *SETTINGS):  # noqa: B007 - the last value is the point
        pass
    return out[-1]


def test_the_title_is_the_whole_first_line():
    assert title_from(f"  {LONG_TITLE}  \nmore lines here") == LONG_TITLE
    assert title_from("\n\n  second   line  ") == "second line"


def test_titles_are_stored_whole_and_searchable(sidebar):
    handlers, panel, store = sidebar
    send(handlers, LONG_TITLE)
    handlers.clear()
    send(handlers, "Another question about tokenizers")
    (full,) = [s.title for s in store.list_conversations() if s.title.startswith("Write")]
    assert full == LONG_TITLE  # never cut in the store; the list shortens it on screen (CSS) only
    assert [label.split(" · ")[0] for label, _ in panel.choices("PALINDROME checker")] == [LONG_TITLE]
    assert len(panel.choices("")) == 2 and panel.choices("nothing like this") == []


def test_export_file_names_come_from_the_full_title_made_file_safe():
    assert file_stem("a/b\\c: d*e?", 3) == "a-b-c-d-e-3"
    stem = file_stem(LONG_TITLE, 7)
    assert stem.startswith("Write-a-palindrome-checker") and stem.endswith("-7")
    assert len(stem) <= conversations.FILE_STEM_CHARS + 3 and "--" not in stem
    assert file_stem("¿¡…!?", 1) == "conversation-1"


def test_delete_hides_at_once_and_undo_brings_it_back(sidebar, monkeypatch):
    handlers, panel, store = sidebar
    monkeypatch.setattr(conversations, "UNDO_S", 0.3)
    send(handlers, "keep me around")
    (summary,) = store.list_conversations()
    listed, undo, status, title, *_window = panel.delete_with_undo(summary.id, "")
    assert listed["choices"] == [] and undo["visible"] is True and "Undo" in status and title == ""
    assert "just deleted" in panel.open(summary.id, True)[2]
    _listed, undo, status, _timer = panel.undo_delete("")
    assert "Brought back" in status and undo["visible"] is False
    time.sleep(0.6)
    assert [s.id for s in store.list_conversations()] == [summary.id]  # the timer did not delete it

    panel.delete_with_undo(summary.id, "")
    time.sleep(0.8)  # no undo: the deletion goes through
    assert store.list_conversations() == []
    assert "Nothing to undo" in panel.undo_delete("")[2]


def test_a_deletion_waiting_for_its_undo_goes_through_when_the_app_stops(tmp_path):
    path = tmp_path / "conversations.db"
    store = store_db.ConversationStore(path)
    recorder = Recorder(store)
    handlers = Handlers(echo_manager(), recorder)
    panel = ConversationHandlers(store, recorder, handlers.manager)
    send(handlers, "delete me, then quit")
    (summary,) = store.list_conversations()
    panel.delete_with_undo(summary.id, "")
    store.close()  # within UNDO_S: the timer would find the store closed
    assert not panel.pending
    with store_db.ConversationStore(path) as reopened:
        assert reopened.list_conversations() == []
    with pytest.raises(store_db.StoreError, match="closed"):
        store.create_conversation("after the end", "echo")


def test_search_finds_words_in_any_message_of_a_conversation(sidebar):
    handlers, panel, store = sidebar
    send(handlers, "First question about rivers")
    send(handlers, "and now the Zambezi delta", [])  # a second message in the same conversation
    handlers.clear()
    send(handlers, "Another question about mountains")
    labels = lambda query: [label.split(" · ")[0] for label, _ in panel.choices(query)]  # noqa: E731
    assert labels("zambezi") == ["First question about rivers"]  # not in its title: in its second message
    assert labels("ZAMBEZI rivers") == ["First question about rivers"]  # every word, anywhere in it
    assert labels("zambezi mountains") == []  # no conversation holds both
    assert sorted(labels("question")) == ["Another question about mountains", "First question about rivers"]
    assert store.conversations_holding(["ΔΈΛΤΑ"]) == set()
    update = panel.refresh("zambezi mountains")
    assert update["choices"] == [] and update["info"] == "No conversation holds “zambezi mountains”."
    assert panel.refresh("zambezi")["info"] == ""


def test_search_folds_case_beyond_ascii(sidebar):
    handlers, panel, store = sidebar
    send(handlers, "Über die Straße")
    handlers.clear()
    assert [label.split(" · ")[0] for label, _ in panel.choices("über STRASSE")] == ["Über die Straße"]


def test_the_answer_being_saved_is_known_until_it_ends(tmp_path):
    with store_db.ConversationStore(tmp_path / "conversations.db") as store:
        recorder = Recorder(store)
        handlers = Handlers(echo_manager(0.02), recorder)
        answer = handlers.send("a few words to stream slowly", [], *SETTINGS)
        live = None
        for _ in answer:
            live = live or recorder.streaming()
        (summary,) = store.list_conversations()
        assert live is not None and live.conversation_id == summary.id and live.owner == "local"
        assert recorder.streaming() is None  # it ended


def test_an_answer_whose_saving_failed_is_no_longer_called_the_one_being_saved(tmp_path, monkeypatch):
    with store_db.ConversationStore(tmp_path / "conversations.db") as store:
        recorder = Recorder(store)
        handlers = Handlers(echo_manager(0.02), recorder)

        def full_disk(*_args, **_kwargs):
            raise store_db.StoreError("disk full")

        monkeypatch.setattr(store, "append_tokens", full_disk)
        for _ in handlers.send("a few words to stream slowly", [], *SETTINGS):
            pass
        assert recorder.streaming() is None  # else every page loaded later would try to follow it
