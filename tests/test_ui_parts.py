"""The UI's parts without a server: control parsing, the model manager (switching, refusals, queueing), the recorder."""

from __future__ import annotations

import math
import threading
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localspec.config import ConfigError, ModelSpec, SamplingParams
from localspec.ui.manager import Busy, ModelManager, drain
from localspec.ui.settings import first_difference, read_k, read_proposer, read_sampling, read_tree_nodes

GOOD = dict(temperature=0.0, top_p=1.0, top_k=0, max_new_tokens=16, seed=0)


@pytest.mark.parametrize(
    "field,value,words",
    [
        ("max_new_tokens", 0, "max new tokens"),
        ("max_new_tokens", -3, "max new tokens"),
        ("max_new_tokens", None, "empty"),
        ("max_new_tokens", 2.5, "whole number"),
        ("temperature", 9.0, "temperature"),
        ("temperature", math.nan, "finite"),
        ("top_p", 0.0, "top-p"),
        ("top_p", 1.5, "top-p"),
        ("top_k", -1, "top-k"),
        ("seed", 2**70, "seed"),
        ("seed", -1, "seed"),
        ("temperature", "hot", "number"),
        ("seed", 10**400, "seed"),
    ],
)
def test_bad_controls_are_messages(field, value, words):
    with pytest.raises(ConfigError, match=words):
        read_sampling(**{**GOOD, field: value})


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(sorted(GOOD)),
        st.one_of(
            st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8)
        ),
    )
)
def test_any_control_values_give_params_or_our_error(values):
    try:
        params = read_sampling(**{**GOOD, **values})
    except ConfigError:
        return
    assert isinstance(params, SamplingParams) and params.max_new_tokens >= 1


def test_k_and_proposer_checks():
    assert read_k(4.0) == 4
    with pytest.raises(ConfigError, match="between 1 and 16"):
        read_k(17)
    assert read_proposer("ngram", ("none", "ngram")) == "ngram"
    with pytest.raises(ConfigError, match="not available"):
        read_proposer("draft", ("none", "ngram"))


def test_tree_nodes_check():
    assert read_tree_nodes(8.0) == 8 and read_tree_nodes(0) == 0
    for bad, words in ((33, "between 0 and 32"), (-1, "between 0 and 32"), (2.5, "whole number"), ("", "empty")):
        with pytest.raises(ConfigError, match=words):
            read_tree_nodes(bad)


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2


# ---- the manager ----------------------------------------------------------------------------------------------


def _factory(tiny_session, fail_for=("broken",)):
    def factory(pair, progress):
        progress(f"loading {pair.name}")
        if pair.name in fail_for:
            raise ConfigError(f"model pair {pair.name!r} target: local model path /nowhere does not exist")
        return tiny_session

    return factory


@pytest.fixture
def manager(tiny_session):
    pair = tiny_session.loaded.spec
    broken = replace(pair, name="broken")
    trusted = replace(pair, name="remote", target=ModelSpec("some/model", trust_remote_code=True))
    manager = ModelManager([pair, broken, trusted], _factory(tiny_session))
    manager.load(pair.name)
    return manager


def run_answer(manager, max_new=16, proposer="ngram", cancel=None, messages=None, sink=None, owner=""):
    cancel = cancel or threading.Event()
    sampling = SamplingParams(max_new_tokens=max_new)
    out = manager.answer(
        messages or [{"role": "user", "content": "hello hello"}],
        sampling,
        lambda s: s.default_spec(proposer=proposer),
        cancel,
        sink,
        owner,
    )
    return out, cancel


def collect(out):
    messages = []
    while not messages or messages[-1].kind != "done":
        messages.extend(drain(out, 1.0))
    return messages


def test_failed_load_keeps_the_previous_pair(manager, tiny_session):
    progress = []
    with pytest.raises(ConfigError, match="does not exist"):
        manager.load("broken", progress.append)
    assert progress == ["loading broken"]
    assert manager.name == tiny_session.loaded.spec.name and manager.session is tiny_session
    messages = collect(run_answer(manager)[0])
    assert any(m.kind == "event" for m in messages) and not any(m.kind == "error" for m in messages)


def test_switch_during_an_answer_is_refused(manager):
    out, cancel = run_answer(manager, max_new=1000, proposer="none")
    first = next(m for m in iter(lambda: out.get(timeout=30), None) if m.kind == "event")
    assert first.records
    with pytest.raises(Busy, match="answer is streaming"):
        manager.load("broken")
    cancel.set()
    messages = collect(out)
    finished = [m.event for m in messages if m.kind == "event" and m.event.finished]
    assert finished and finished[-1].finish_reason == "cancelled"
    with pytest.raises(ConfigError, match="does not exist"):  # once free, the switch is tried (and fails here)
        manager.load("broken")


def test_answers_are_served_one_at_a_time(manager):
    first, cancel_first = run_answer(manager, max_new=1000, proposer="none")
    next(m for m in iter(lambda: first.get(timeout=30), None) if m.kind == "event")
    second, _ = run_answer(manager, max_new=8)
    waiting = list(drain(second, 0.5))
    assert [m.kind for m in waiting] == ["waiting"]  # queued behind the first answer, nothing interleaved
    cancel_first.set()
    collect(first)
    messages = collect(second)
    assert [m.kind for m in messages][0] == "started" and messages[-1].kind == "done"


def test_stop_while_waiting_ends_the_queued_request(manager):
    first, cancel_first = run_answer(manager, max_new=1000, proposer="none")
    next(m for m in iter(lambda: first.get(timeout=30), None) if m.kind == "event")
    second, cancel_second = run_answer(manager, max_new=8)
    cancel_second.set()
    messages = collect(second)
    assert [m.kind for m in messages if m.kind != "waiting"] == ["error", "done"]
    cancel_first.set()
    collect(first)


def test_errors_in_the_answer_are_messages(manager):
    messages = collect(run_answer(manager, messages=[{"role": "user", "content": "   "}])[0])
    assert [m.kind for m in messages] == ["error", "done"] and "empty" in messages[0].text
    messages = collect(run_answer(manager, proposer="head")[0])
    assert messages[0].kind == "error" and "head" in messages[0].text


def test_a_failing_sink_does_not_stop_the_answer(manager):
    def sink(message):
        raise RuntimeError("disk full")

    messages = collect(run_answer(manager, sink=sink)[0])
    assert any(m.kind == "notice" and "disk full" in m.text for m in messages)
    assert any(m.kind == "event" and m.event.finished for m in messages)


def test_trust_remote_code_entries_are_marked(manager):
    labels = dict((value, label) for label, value in manager.choices())
    assert "trust_remote_code" in labels["remote"] and "trust_remote_code" not in labels["broken"]


# ---- the recorder ---------------------------------------------------------------------------------------------


def test_recorder_saves_every_step_and_the_end(manager, tmp_path):
    store_module = pytest.importorskip("localspec.store.db")
    from localspec.ui.recorder import Recorder, turns_from_conversation

    store = store_module.ConversationStore(tmp_path / "c.db")
    recorder = Recorder(store)
    messages = collect(run_answer(manager, max_new=24, sink=recorder.sink("tab", "hello hello"))[0])
    events = [m for m in messages if m.kind == "event"]
    (summary,) = store.list_conversations()
    conversation = store.get_conversation(summary.id)
    user, answer = conversation.messages
    assert user.content == "hello hello" and answer.complete and answer.proposer == "ngram"
    assert [t["id"] for t in answer.tokens] == [r["id"] for m in events for r in m.records]
    assert answer.stats["emitted"] == events[-1].event.stats.emitted
    turns = turns_from_conversation(conversation)
    assert turns[1]["tokens"][0]["kind"] == answer.tokens[0]["kind"]
    # the same tab continues the same conversation; after set_conversation(None) a new one starts
    collect(run_answer(manager, max_new=4, sink=recorder.sink("tab", "again"))[0])
    assert len(store.list_conversations()) == 1
    recorder.set_conversation("tab", None)
    collect(run_answer(manager, max_new=4, sink=recorder.sink("tab", "new one"))[0])
    assert len(store.list_conversations()) == 2
    store.close()


def test_a_message_longer_than_the_context_is_cut_with_a_notice(manager):
    from localspec.chat import TRUNCATION_POLICY

    long_message = "word " * 3000  # the tiny model's context holds 1024 tokens (one per byte)
    messages = collect(run_answer(manager, max_new=4, messages=[{"role": "user", "content": long_message}])[0])
    notices = [m.text for m in messages if m.kind == "notice"]
    assert notices and TRUNCATION_POLICY in notices[0] and "only its end was kept" in notices[0]
    assert any(m.kind == "event" for m in messages)


def test_one_answer_at_a_time_per_window_and_stop_reaches_it(manager):
    out, _cancel = run_answer(manager, max_new=1000, proposer="none", owner="tab")
    next(m for m in iter(lambda: out.get(timeout=30), None) if m.kind == "event")
    with pytest.raises(Busy, match="still streaming in this window"):
        run_answer(manager, owner="tab")
    other, _ = run_answer(manager, max_new=4, owner="other tab")  # another window queues instead
    assert manager.is_answering("tab") and manager.cancel("tab")
    finished = [m.event for m in collect(out) if m.kind == "event" and m.event.finished]
    assert finished[-1].finish_reason == "cancelled"
    collect(other)
    assert not manager.is_answering("tab") and not manager.is_answering("other tab")


# ---- the send handler, in process ------------------------------------------------------------------------------


def _poison_lm_head(module, inputs, output):
    output = output.clone()
    output[..., 5] = math.nan
    return output


def test_send_handler_streams_and_reports_a_broken_model(manager, tiny_session):
    from localspec.ui.handlers import Handlers

    handlers = Handlers(manager)
    outputs = list(handlers.send("hello hello", [], "ngram", 3, 0.0, 1.0, 0, 24, 0, True, 0))
    transcript, _stats, status, events, _box, turns = outputs[-1]
    assert "Done" in status and [t["role"] for t in turns] == ["user", "assistant"]
    assert events["tokens"] and 'class="tok tok-' in transcript

    handle = tiny_session.loaded.target.get_output_embeddings().register_forward_hook(_poison_lm_head)
    try:
        outputs = list(handlers.send("and now?", turns, "ngram", 3, 0.0, 1.0, 0, 24, 0, True, 0))
    finally:
        handle.remove()
    transcript, _stats, status, _events, box, after = outputs[-1]
    assert "NaN or infinite logits" in status and "ls-status-error" in status
    assert after == turns and box == "and now?"  # nothing was said: the message is back in the box
    outputs = list(handlers.send("and now?", turns, "ngram", 3, 0.0, 1.0, 0, 8, 0, True, 0))
    assert "Done" in outputs[-1][2]  # the app is still usable


def _spy_specs(session, monkeypatch) -> list:
    """The SpecConfig of every answer the session streams."""
    specs, stream_ids = [], session.stream_ids

    def spy(ids, sampling, spec, cancel=None, first_source=()):
        specs.append(spec)
        return stream_ids(ids, sampling, spec, cancel, first_source)

    monkeypatch.setattr(session, "stream_ids", spy)
    return specs


def test_tree_nodes_reach_the_spec_and_the_answer_label(manager, tiny_session, monkeypatch):
    from localspec.ui.handlers import Handlers

    assert tiny_session.engine.target.supports_tree  # the tiny target runs the preallocated cache
    specs = _spy_specs(tiny_session, monkeypatch)
    handlers = Handlers(manager)
    *_, events, _box, turns = list(handlers.send("hello hello", [], "ngram", 3, 0.0, 1.0, 0, 12, 0, True, 5))[-1]
    assert specs[-1].tree_nodes == 5 and specs[-1].k == 3 and specs[-1].proposer == "ngram"
    assert turns[-1]["tree_nodes"] == 5 and events["tree_nodes"] == 5
    assert turns[-1]["label"].endswith("n-gram · tree 5") and "K=" not in turns[-1]["label"]
    # a proposer that drafts chains only (the draft model): the answer runs, and says, chains of K
    *_, turns = list(handlers.send("hello again", turns, "draft", 2, 0.0, 1.0, 0, 8, 0, True, 5))[-1]
    assert specs[-1].proposer == "draft" and specs[-1].tree_nodes == 0
    assert turns[-1]["tree_nodes"] == 0 and turns[-1]["label"].endswith("draft model · K=2")


def _echo_handlers(**trees):
    """Handlers over echo pairs: 'echo' (chains) and one pair per keyword, with that many tree nodes."""
    from localspec.ui.echo import ECHO_PAIR, EchoSession
    from localspec.ui.handlers import Handlers

    pairs = [ECHO_PAIR] + [replace(ECHO_PAIR, name=name, tree_nodes=n) for name, n in trees.items()]
    manager = ModelManager(pairs, lambda pair, _progress: EchoSession(pair=pair))
    manager.load("echo")
    return Handlers(manager)


@pytest.mark.parametrize("bad, words", [(40, "between 0 and 32"), (2.5, "whole number"), (None, "empty")])
def test_a_bad_tree_nodes_is_refused_with_the_message_back_in_the_box(bad, words):
    from localspec.ui.actions import Actions

    handlers = _echo_handlers()
    settings = ("ngram", 3, 0.0, 1.0, 0, 16, 0, True)
    _transcript, _stats, status, _events, box, turns = list(handlers.send("keep me", [], *settings, bad))[-1]
    assert "tree nodes" in status and words in status and "ls-status-error" in status
    assert box == "keep me" and turns == []  # nothing lost, nothing sent
    *_, turns = list(handlers.send("keep me", [], *settings, 4))[-1]
    assert turns[-1]["content"] == "keep me" and turns[-1]["label"].endswith("· tree 4")
    *_, status, _events, after = list(Actions(handlers).regenerate(turns, None, *settings, bad))[-1]
    assert "tree nodes" in status and words in status and after == turns  # the answer stays


def test_a_switch_and_a_page_load_reset_tree_nodes_to_the_pairs():
    handlers = _echo_handlers(trees=8)
    status, name, _proposer, k, tree = list(handlers.switch("trees"))[-1]
    assert "Loaded trees" in status and name == "trees" and tree["value"] == 8 and k["value"] == 3
    model, _proposer, _k, tree, _status = handlers.on_load()
    assert model == "trees" and tree["value"] == 8
    *_, status, _events, _box, turns = list(handlers.send("a tree", [], "ngram", 3, 0.0, 1.0, 0, 8, 0, True, 8))[-1]
    assert turns[-1]["label"] == "trees · n-gram · tree 8"
    *_, tree = list(handlers.switch("echo"))[-1]
    assert tree["value"] == 0
    handlers.shown["other tab"] = "trees"  # another tab still shows the pair switched away from
    model, _proposer, _k, tree, status = handlers.refresh_pair(type("R", (), {"session_hash": "other tab"})())
    assert model == "echo" and tree["value"] == 0 and "switched to echo" in status


def test_the_same_switch_asked_twice_shares_one_outcome(tiny_session):
    release = threading.Event()
    calls = []

    def slow_failing(pair, progress):
        calls.append(pair.name)
        release.wait(10)
        raise ConfigError("local model path /nowhere does not exist")

    pair = tiny_session.loaded.spec
    manager = ModelManager([pair, replace(pair, name="broken")], slow_failing)
    errors = []

    def switch():
        try:
            manager.load("broken")
        except ConfigError as exc:
            errors.append(str(exc))

    threads = [threading.Thread(target=switch) for _ in range(2)]
    threads[0].start()
    while manager.loading != "broken":
        pass
    threads[1].start()
    release.set()
    for thread in threads:
        thread.join(10)
    assert calls == ["broken"]  # loaded once
    assert errors == ["local model path /nowhere does not exist"] * 2  # both callers hear why, not "busy"


def test_an_answer_that_fails_before_its_first_token_is_taken_back_from_the_store(manager, tmp_path):
    """The window puts the message back in the box; the database must not keep it (a resend would store it twice)."""
    store_module = pytest.importorskip("localspec.store.db")
    from localspec.config import SpecConfig
    from localspec.engine.events import StepEvent
    from localspec.engine.metrics import StatsSnapshot
    from localspec.ui.manager import Message
    from localspec.ui.recorder import Recorder

    store = store_module.ConversationStore(tmp_path / "c.db")
    recorder = Recorder(store)
    failed = StepEvent.finished_early(StatsSnapshot.start(0), "error", "generation failed: boom")

    def fail(text, end_with_done_only=False):
        sink = recorder.sink("tab", text)
        sink(Message("started", text="tiny", spec=SpecConfig(proposer="none", k=0)))
        if not end_with_done_only:
            sink(Message("event", event=failed))
        sink(Message("done"))

    fail("first message")
    assert store.list_conversations() == [] and recorder.conversation_of("tab") is None
    collect(run_answer(manager, max_new=4, sink=recorder.sink("tab", "kept"))[0])
    fail("second message")
    fail("third message", end_with_done_only=True)
    (summary,) = store.list_conversations()
    assert [m.content for m in store.get_conversation(summary.id).messages][0] == "kept"
    assert len(store.get_conversation(summary.id).messages) == 2  # "kept" and its answer, no failed leftovers
    assert recorder.conversation_of("tab") == summary.id
    store.close()


def test_loopback_detection():
    from localspec.ui.serve import is_loopback

    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.5") and not is_loopback("example.org")


def test_turns_round_trip_through_the_state_form():
    from localspec.ui.settings import answer_label
    from localspec.ui.turns import AssistantTurn, UserTurn, turns_from_state, turns_to_state

    answer = AssistantTurn(
        content="hi",
        tokens=[{"id": 5, "text": "hi", "kind": "target"}],
        streaming=True,
        model="tiny",
        proposer="ngram",
        k=3,
        label=answer_label("tiny", "ngram", 3),
    )
    state = turns_to_state([UserTurn("hello"), answer])
    assert state[0] == {"role": "user", "content": "hello"}
    assert state[1]["role"] == "assistant" and state[1]["pending"] is True
    assert state[1]["label"] == "tiny · n-gram · K=3"
    back = turns_from_state(state)
    assert back == [UserTurn("hello"), answer]
    answer.streaming = False
    assert "pending" not in answer.to_state()
    assert answer_label("tiny", "none", 3) == "tiny · off"  # K means nothing without a proposer
    assert answer_label("tiny", "ngram+head", 4, 8) == "tiny · n-gram, else head · tree 8"
    assert answer_label("tiny", "ngram", 4, 0) == "tiny · n-gram · K=4"
    old = {"role": "assistant", "content": "x", "model": "tiny", "proposer": "ngram", "k": 3}  # saved before trees
    assert turns_from_state([old])[0].tree_nodes is None
