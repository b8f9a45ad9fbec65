"""Saved conversations through the app (issue 7, app side): kill -9 mid-answer, two clients at once, a closed
client, Stop, reopen / rename / delete / export, a corrupt database file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .apphelpers import AppProcess, send, send_from_two_clients, tiny_models_yaml
from .support import span_kinds, wait_until

pytest.importorskip("localspec.store.db")
pytestmark = pytest.mark.slow  # every test starts the app in a subprocess


def open_store(home: Path):
    from localspec.store.db import ConversationStore

    return ConversationStore(home / "conversations.db")


def client_for(app):
    from gradio_client import Client

    return Client(app.url, verbose=False)


def choices(client) -> list[tuple[str, int]]:
    update = client.predict(api_name="/list_conversations")
    return [tuple(c) for c in update["choices"]]


@pytest.fixture(scope="module")
def stored_app(tiny_pair, tmp_path_factory):
    home = tmp_path_factory.mktemp("store-app")
    process = AppProcess(tiny_models_yaml(tiny_pair, home), home).wait_ready()
    process.home = home
    yield process
    process.stop()


def test_kill_9_mid_answer_keeps_the_partial_answer(tiny_pair, tmp_path):
    models = tiny_models_yaml(tiny_pair, tmp_path)
    app = AppProcess(models, tmp_path).wait_ready()
    try:
        job = send(client_for(app), "tell me a very long story", max_new=4000)
        for update in job:
            if len(span_kinds(str(update[0]))) >= 20:
                break
        app.kill()  # SIGKILL: no cleanup, no finish_answer
    finally:
        app.stop()
    with open_store(tmp_path) as store:
        (summary,) = store.list_conversations()
        assert summary.incomplete
        conversation = store.get_conversation(summary.id)
        user, answer = conversation.messages
        assert user.content == "tell me a very long story"
        assert not answer.complete and answer.finish_reason is None
        assert len(answer.tokens) >= 20 and answer.content == "".join(t["text"] for t in answer.tokens)
        stored_kinds = [t["kind"] for t in answer.tokens if t["text"]]
        assert set(stored_kinds) <= {"accepted", "resampled", "bonus", "target"} and len(set(stored_kinds)) >= 2

    app = AppProcess(models, tmp_path).wait_ready()  # restart on the same data
    try:
        client = client_for(app)
        ((label, cid),) = choices(client)
        assert label.startswith("[incomplete]") and cid == summary.id
        transcript, _stats, status, events, turns_title, _system = client.predict(
            cid, True, api_name="/open_conversation"
        )
        assert "incomplete" in status and "the app stopped during this answer" in transcript
        assert span_kinds(transcript) == stored_kinds  # highlighting comes back
        assert turns_title == summary.title
        # the reopened conversation continues: a new message appends to it
        send(client, "and then?", max_new=8).result()
        with open_store(tmp_path) as store:
            assert [m.role for m in store.get_conversation(cid).messages] == ["user", "assistant"] * 2
    finally:
        app.stop()


def test_two_clients_each_get_their_own_conversation(stored_app):
    prompts = ["first client asks", "second client asks"]
    results = send_from_two_clients(stored_app.url, prompts)
    assert set(results) == {0, 1}
    with open_store(stored_app.home) as store:
        by_prompt = {}
        for summary in store.list_conversations():
            conversation = store.get_conversation(summary.id)
            if conversation.messages and conversation.messages[0].content in prompts:
                by_prompt[conversation.messages[0].content] = conversation
    assert set(by_prompt) == set(prompts)
    for i, prompt in enumerate(prompts):
        user, answer = by_prompt[prompt].messages  # nothing else landed in it
        assert answer.complete and answer.finish_reason in ("stop", "length")
        assert [t["id"] for t in answer.tokens] == [t["id"] for t in results[i][3]["tokens"]]


def test_a_closed_client_still_gets_its_answer_saved(stored_app):
    client = client_for(stored_app)
    job = send(client, "client that goes away", max_new=300)
    for update in job:
        if span_kinds(str(update[0])):
            break
    job.cancel()  # the browser tab is gone; the answer keeps running and is saved whole
    client.close() if hasattr(client, "close") else None

    def finished():
        with open_store(stored_app.home) as store:
            for summary in store.list_conversations():
                conversation = store.get_conversation(summary.id)
                if conversation.messages[0].content == "client that goes away":
                    answer = conversation.messages[1]
                    return answer if answer.complete else None
        return None

    answer = wait_until(finished, 120.0, "the answer of a closed client to be saved", every_s=0.2)
    assert answer.finish_reason in ("stop", "length") and len(answer.tokens) > 0


def test_stop_is_saved_as_cancelled(stored_app):
    client = client_for(stored_app)
    job = send(client, "stop me please", proposer="none", max_new=4000)
    for update in job:
        if len(span_kinds(str(update[0]))) >= 5:
            break
    client.predict(api_name="/stop")
    events = job.result(timeout=60)[3]
    with open_store(stored_app.home) as store:
        cid = next(
            s.id
            for s in store.list_conversations()
            if store.get_conversation(s.id).messages[0].content == "stop me please"
        )
        answer = store.get_conversation(cid).messages[1]
    assert answer.complete and answer.finish_reason == "cancelled"
    assert [t["id"] for t in answer.tokens] == [t["id"] for t in events["tokens"]]


def test_reopen_rename_export_delete(stored_app):
    client = client_for(stored_app)
    send(client, "a conversation to manage", max_new=16).result()
    send(client, "its second turn", max_new=16).result()
    cid = next(c for label, c in choices(client) if "a conversation to manage" in label)

    hostile = '<img src=x onerror="alert(1)"> title'
    update, status = client.predict(cid, hostile, api_name="/rename_conversation")
    assert "Renamed" in status and (hostile + " · ") in dict((c, label) for label, c in update["choices"])[cid]

    transcript, _stats, status, events, title, _system = client.predict(cid, True, api_name="/open_conversation")
    assert title == hostile and "<img" not in status and "&lt;img" in status
    assert transcript.count("ls-msg ls-user") == 2 and span_kinds(transcript)
    assert events["finish_reason"] in ("stop", "length")
    panel, status = client.predict(api_name="/compare")  # the reopened answer's sampling settings were saved
    assert "Baseline done" in status and "tok/s" in panel

    path, status = client.predict(cid, api_name="/export_json")
    exported = json.loads(Path(path).read_text(encoding="utf-8"))
    assert exported["title"] == hostile and len(exported["messages"]) == 4
    assert exported["messages"][3]["sampling"]["max_new_tokens"] == 16
    assert exported["messages"][1]["tokens"] and "kind" in exported["messages"][1]["tokens"][0]
    path, status = client.predict(cid, api_name="/export_markdown")
    markdown = Path(path).read_text(encoding="utf-8")
    assert "a conversation to manage" in markdown and "its second turn" in markdown

    result = client.predict(cid, api_name="/delete_conversation")  # (list, status): buttons are not API outputs
    update, status = result[0], result[-1]
    assert "Deleted" in status and cid not in [c for _l, c in update["choices"]]
    _t, _s, status, *_ = client.predict(cid, True, api_name="/open_conversation")
    assert "does not exist" in status
    # the tab's next message starts a new conversation instead of writing into the deleted one
    send(client, "after the delete", max_new=8).result()
    assert any("after the delete" in label for label, _c in choices(client))


def test_corrupt_database_is_moved_aside(tiny_pair, tmp_path):
    (tmp_path / "conversations.db").write_bytes(b"this is not a database" * 100)
    app = AppProcess(tiny_models_yaml(tiny_pair, tmp_path), tmp_path).wait_ready()
    try:
        log = app.log_text()
        assert "damaged" in log and "conversations.db.corrupt-" in log
        moved = list(tmp_path.glob("conversations.db.corrupt-*"))
        assert len(moved) == 1 and moved[0].read_bytes().startswith(b"this is not a database")
        transcript = send(client_for(app), "fresh start", max_new=8).result()[0]
        assert span_kinds(transcript)
        with open_store(tmp_path) as store:
            assert len(store.list_conversations()) == 1
    finally:
        app.stop()
