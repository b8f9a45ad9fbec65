"""Regenerate, and edit and resend (localspec/ui/actions.py): the handlers run in-process on the echo session
(it answers with the user's own message) with a real ConversationStore."""

from __future__ import annotations

from dataclasses import replace

import pytest

from localspec.ui.actions import Actions
from localspec.ui.echo import echo_manager, pieces
from localspec.ui.handlers import Handlers
from localspec.ui.recorder import Recorder

store_db = pytest.importorskip("localspec.store.db")

# proposer, k, temperature, top_p, top_k, max_new_tokens, seed, colour, tree nodes
SETTINGS = ("ngram", 3, 0.0, 1.0, 0, 256, 0, True, 0)


def last(generator):
    out = None
    for out in generator:  # noqa: B007 - the last value is the point
        pass
    return out


@pytest.fixture
def app(tmp_path):
    store = store_db.ConversationStore(tmp_path / "conversations.db")
    handlers = Handlers(echo_manager(), Recorder(store))
    yield handlers, Actions(handlers), store
    store.close()


def send(handlers, text, turns, settings=SETTINGS):
    """Send through the Send handler; returns (status html, message box, turns)."""
    _transcript, _stats, status, _events, box, turns = last(handlers.send(text, turns, *settings))
    return status, box, turns


def saved(store) -> list[tuple[str, str]]:
    (summary,) = store.list_conversations()
    return [(m.role, m.content) for m in store.get_conversation(summary.id).messages]


def test_regenerate_answers_the_same_message_again_with_the_current_settings(app):
    handlers, actions, store = app
    _, _, turns = send(handlers, "first question here", [])
    _, _, turns = send(handlers, "tell me about speculative decoding", turns)
    assert turns[-1]["content"] == "tell me about speculative decoding"
    shorter = SETTINGS[:5] + (3,) + SETTINGS[6:]  # max new tokens 3 now
    transcript, _stats, status, _events, turns = last(actions.regenerate(turns, None, *shorter))
    assert [t["role"] for t in turns] == ["user", "assistant", "user", "assistant"]
    assert turns[-1]["content"] == "".join(pieces("tell me about speculative decoding")[:3])
    assert turns[-1]["sampling"]["max_new_tokens"] == 3 and "Done: 3 tokens" in status
    assert transcript.count('class="tok tok-') == len(pieces("first question here")) + 3
    assert saved(store) == [
        ("user", "first question here"),
        ("assistant", "first question here"),
        ("user", "tell me about speculative decoding"),
        ("assistant", turns[-1]["content"]),
    ]
    (summary,) = store.list_conversations()
    answer = store.get_conversation(summary.id).messages[-1]
    assert answer.complete and answer.sampling["max_new_tokens"] == 3 and len(answer.tokens) == 3


def test_regenerate_with_nothing_to_regenerate_says_so(app):
    _handlers, actions, store = app
    *_, status, _events, turns = last(actions.regenerate([], None, *SETTINGS))
    assert "Send a message first" in status and turns == [] and store.list_conversations() == []


def test_a_regenerate_that_fails_before_its_first_token_keeps_the_previous_answer(app, monkeypatch):
    handlers, actions, store = app
    _, _, turns = send(handlers, "keep this answer", [])

    def broken(*_args, **_kwargs):
        raise RuntimeError("the model broke")

    monkeypatch.setattr(handlers.manager.session, "stream_ids", broken)
    *_, status, _events, after = last(actions.regenerate(turns, None, *SETTINGS))
    assert "the model broke" in status and "previous answer is kept" in status
    assert after[-1]["content"] == "keep this answer" and len(after) == 2
    assert saved(store) == [("user", "keep this answer"), ("assistant", "keep this answer")]


def test_edit_puts_the_last_message_back_and_send_replaces_that_exchange(app):
    handlers, actions, store = app
    _, _, turns = send(handlers, "hello", [])
    _, _, turns = send(handlers, "a message with a typo", turns)
    transcript, status, box, turns, editing, cancel = actions.edit(turns, None, True)
    assert box == "a message with a typo" and "Editing" in status
    assert [t["content"] for t in turns] == ["hello", "hello"]
    assert "typo" in transcript and transcript.count("ls-editing") == 2  # still in view, marked as being edited
    assert cancel["visible"] is True and editing["at"] == 2
    assert saved(store)[-1] == ("assistant", "a message with a typo")  # stored until the resend answers
    _, _, turns = send(handlers, "a message without it", turns)
    assert [t["content"] for t in turns] == ["hello", "hello", "a message without it", "a message without it"]
    assert saved(store) == [
        ("user", "hello"),
        ("assistant", "hello"),
        ("user", "a message without it"),
        ("assistant", "a message without it"),
    ]
    editing, cancel = actions.after_send(turns, editing)
    assert editing is None and cancel["visible"] is False
    _, _, turns = send(handlers, "and one more", turns)  # the edit is over: this one is added, not replacing
    assert len(saved(store)) == 6 and len(turns) == 6


def test_cancel_edit_puts_the_exchange_back_and_the_next_send_adds_to_it(app):
    handlers, actions, store = app
    _, _, turns = send(handlers, "hello", [])
    _, _, turns = send(handlers, "second", turns)
    _, _, _, trimmed, editing, _ = actions.edit(turns, None, True)
    _transcript, status, box, restored, editing, cancel = actions.cancel_edit(trimmed, editing, True)
    assert restored == turns and box == "" and editing is None and cancel["visible"] is False
    assert "cancelled" in status
    _, _, turns = send(handlers, "third", restored)
    assert [c for _, c in saved(store)] == ["hello", "hello", "second", "second", "third", "third"]


def test_edit_while_nothing_was_said_or_while_editing_is_refused(app):
    handlers, actions, _store = app
    _transcript, status, _box, turns, editing, _ = actions.edit([], None, True)
    assert "Send a message first" in status and editing is None
    _, _, turns = send(handlers, "hello", [])
    _, _, _, trimmed, editing, _ = actions.edit(turns, None, True)
    _transcript, status, *_ = actions.edit(trimmed, editing, True)
    assert "already editing" in status
    *_, status, _events, _turns = last(actions.regenerate(trimmed, editing, *SETTINGS))
    assert "finish the edit first" in status


def test_an_edited_resend_that_fails_before_its_first_token_leaves_the_edit_pending(app, monkeypatch):
    handlers, actions, store = app
    _, _, turns = send(handlers, "hello", [])
    _, _, turns = send(handlers, "second", turns)
    _, _, _, trimmed, _editing, _ = actions.edit(turns, None, True)
    original = handlers.manager.session.stream_ids
    monkeypatch.setattr(handlers.manager.session, "stream_ids", lambda *a, **k: iter(()).throw(RuntimeError("x")))
    status, box, after = send(handlers, "second, edited", trimmed)
    assert box == "second, edited" and after == trimmed and "x" in status
    assert [c for _, c in saved(store)] == ["hello", "hello", "second", "second"]
    monkeypatch.setattr(handlers.manager.session, "stream_ids", original)
    _, _, after = send(handlers, "second, edited", after)
    assert [c for _, c in saved(store)] == ["hello", "hello", "second, edited", "second, edited"]


def test_clearing_ends_an_edit(app):
    handlers, actions, store = app
    _, _, turns = send(handlers, "hello", [])
    *_, editing, _ = actions.edit(turns, None, True)
    handlers.clear()
    assert actions.reset()[0] is None
    _, _, turns = send(handlers, "a new conversation", [])
    conversations = [store.get_conversation(s.id) for s in store.list_conversations()]
    assert sorted(len(c.messages) for c in conversations) == [2, 2]  # the first one keeps its exchange
    _transcript, status, *_ = actions.cancel_edit(turns, editing, True)  # a stale edit state puts nothing back
    assert "dropped" in status


def test_regenerate_at_temperature_zero_says_it_repeats_and_regenerate_sampled_samples(app):
    handlers, actions, _store = app
    _, _, turns = send(handlers, "the same words again", [])
    _t, _s, status, _e, greedy_turns = last(actions.regenerate(turns, None, *SETTINGS))
    assert "gives the same answer" in status and "Regenerate sampled" in status
    assert greedy_turns[-1]["content"] == turns[-1]["content"]
    _t, _s, status, _e, sampled = last(actions.regenerate_sampled(greedy_turns, None, *SETTINGS))
    assert sampled[-1]["sampling"]["temperature"] == pytest.approx(0.7) and "same answer" not in status
    warm = SETTINGS[:2] + (0.3,) + SETTINGS[3:]  # a temperature above 0 is kept as it is
    _t, _s, _status, _e, kept = last(actions.regenerate_sampled(sampled, None, *warm))
    assert kept[-1]["sampling"]["temperature"] == pytest.approx(0.3)


def test_keep_speculating_turns_adaptive_k_off_for_the_answer(app):
    from localspec.ui.settings import read_speculation

    assert read_speculation("ngram", 3, 0).adaptive is None  # the pair's own setting
    assert read_speculation("ngram", 3, 0, True).adaptive is False
    handlers, _actions, _store = app
    seen = []
    session = handlers.manager.session
    session.pair = replace(session.pair, adaptive=True)  # an entry that asks for adaptive K
    original = session.stream_ids

    def spy(ids, sampling, spec, cancel=None, first_source=()):
        seen.append(spec.adaptive)
        return original(ids, sampling, spec, cancel, first_source)

    session.stream_ids = spy
    send(handlers, "adaptive on", [], SETTINGS + (False,))
    send(handlers, "adaptive off", [], SETTINGS + (True,))
    assert seen == [True, False]


def with_penalty_and_stops(repetition_penalty=1.0, stops=""):
    """SETTINGS with the inputs that follow them: keep speculating, system prompt, repetition penalty, stop strings."""
    return SETTINGS + (False, "", repetition_penalty, stops)


def test_a_stop_string_ends_the_answer_before_it_in_the_window_and_the_store(app):
    handlers, actions, store = app
    text = "one two three stop here four five"  # echoed in pieces: ... "thre", "e", " ", "stop" ...
    status, _, turns = send(handlers, text, [], with_penalty_and_stops(stops="never\nee st, five"))
    answer = turns[-1]
    assert answer["content"] == "one two thr" and answer["finish_reason"] == "stop", answer["content"]
    assert "".join(t["text"] for t in answer["tokens"]) == "one two thr"  # the token "thre" keeps "thr"
    assert answer["sampling"]["stop"] == ["never", "ee st", "five"] and "Done" in status
    assert saved(store)[-1] == ("assistant", "one two thr")
    _panel, status = last(handlers.compare(turns))  # the baseline repeats the answer's stop strings
    assert "Baseline done: 5 tokens" in status, status
    # Regenerate answers with the box's stop strings now; without any the whole message comes back
    *_, regenerated = last(actions.regenerate(turns, None, *with_penalty_and_stops(stops="two")))
    assert regenerated[-1]["content"] == "one "
    *_, whole = last(actions.regenerate(regenerated, None, *with_penalty_and_stops()))
    assert whole[-1]["content"] == text and "stop" not in whole[-1]["sampling"]
    assert saved(store)[-1] == ("assistant", text)


def test_the_repetition_penalty_reaches_the_sampler_and_bad_values_are_refused(app):
    handlers, _actions, _store = app
    seen = []
    session = handlers.manager.session
    original = session.stream_ids

    def spy(ids, sampling, spec, cancel=None, first_source=()):
        seen.append(sampling.repetition_penalty)
        return original(ids, sampling, spec, cancel, first_source)

    session.stream_ids = spy
    _, _, turns = send(handlers, "penalised", [], with_penalty_and_stops(1.3))
    assert seen == [1.3] and turns[-1]["sampling"]["repetition_penalty"] == 1.3
    status, box, _ = send(handlers, "refused", turns, with_penalty_and_stops(0))
    assert "repetition penalty must be a number &gt; 0" in status and box == "refused" and seen == [1.3]
