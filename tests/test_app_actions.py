"""Regenerate, edit and resend, and the switch progress bar through the served app (gradio_client), on echo
sessions (each answers with the user's own message) and a real ConversationStore."""

from __future__ import annotations

import re

import pytest

from localspec.config import ModelSpec, PairSpec
from localspec.ui.echo import pieces

from .apphelpers import free_port

store_db = pytest.importorskip("localspec.store.db")
pytestmark = pytest.mark.slow

# proposer, k, temperature, top_p, top_k, max new tokens, seed, colour
SETTINGS = ["ngram", 3, 0.0, 1.0, 0, 256, 0, True]
STAGES = ("Loading target slow…", "Loading draft slow…", "Ready.")


def factory(pair, progress):
    from localspec.ui.echo import EchoSession

    if pair.name == "slow":
        for message in STAGES:
            progress(message)
    return EchoSession()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from localspec.ui import build_app, launch_options
    from localspec.ui.manager import ModelManager

    home = tmp_path_factory.mktemp("actions-app")
    store = store_db.ConversationStore(home / "conversations.db")
    pairs = [
        PairSpec(name="echo", target=ModelSpec(source="echo")),
        PairSpec(name="slow", target=ModelSpec(source=str(home)), draft=ModelSpec(source=str(home))),
    ]
    manager = ModelManager(pairs, factory)
    manager.load("echo")
    demo = build_app(manager, store)
    demo.queue(default_concurrency_limit=None)
    port = free_port()
    demo.launch(
        server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, share=False, quiet=True, **launch_options()
    )
    yield f"http://127.0.0.1:{port}/", store
    demo.close()
    store.close()


def client(url):
    from gradio_client import Client

    return Client(url, verbose=False)


def messages_of(store, title_part: str) -> list[tuple[str, str]]:
    (summary,) = [s for s in store.list_conversations() if title_part in s.title]
    return [(m.role, m.content) for m in store.get_conversation(summary.id).messages]


def test_regenerate_through_the_app_shows_the_new_answer_and_keeps_the_first_as_a_version(served):
    url, store = served
    c = client(url)
    c.predict("regenerate me please", *SETTINGS, api_name="/send")
    fewer = SETTINGS[:5] + [2] + SETTINGS[6:]
    transcript, _stats, status, events = c.predict(*fewer, api_name="/regenerate")
    assert "Done: 2 tokens" in status, status
    said = "".join(pieces("regenerate me please")[:2])
    assert len(events["tokens"]) == 2 and "".join(t["text"] for t in events["tokens"]) == said
    assert transcript.count('class="tok tok-') == 2  # the first answer is not shown, only its version switch
    assert "2/2" in transcript
    assert messages_of(store, "regenerate me please") == [("user", "regenerate me please"), ("assistant", said)]
    (summary,) = [s for s in store.list_conversations() if s.title == "regenerate me please"]
    assert len(store.get_conversation(summary.id).every) == 3  # the question and both answers


def test_tree_nodes_through_the_app(served):
    """The tree-nodes input comes last: a caller that leaves it out gets the control's value (chains here)."""
    url, store = served
    c = client(url)
    transcript, _stats, status, _events, box = c.predict("a tree answer please", *SETTINGS, 40, api_name="/send")
    assert "tree nodes" in status and "between 0 and 32" in status and box == "a tree answer please"
    transcript, *_ = c.predict("a tree answer please", *SETTINGS, 8, api_name="/send")
    assert "n-gram · tree 8" in transcript
    (summary,) = [s for s in store.list_conversations() if s.title == "a tree answer please"]
    (answer,) = [m for m in store.get_conversation(summary.id).messages if m.role == "assistant"]
    assert answer.tree_nodes == 8
    transcript, *_ = c.predict("a chain answer please", *SETTINGS, api_name="/send")
    assert transcript.count("n-gram · K=3") == 1 and transcript.count("tree 8") == 1


def test_edit_any_message_regenerate_any_answer_and_switch_versions_through_the_api(served):
    url, store = served
    c = client(url)
    c.predict("api versions one", *SETTINGS, api_name="/send")
    c.predict("api versions two", *SETTINGS, api_name="/send")
    _transcript, status, box = c.predict(True, 0, api_name="/edit_message")[:3]
    assert box == "api versions one" and "Editing" in status
    transcript, *_ = c.predict("api versions uno", *SETTINGS, api_name="/send")
    assert "2/2" in transcript and "api versions two" not in transcript
    transcript, _stats, status, _events = c.predict(True, 0, -1, api_name="/switch_version")
    assert "api versions two" in transcript and "1/2" in transcript, status
    transcript, _stats, status, events = c.predict(*SETTINGS, index=1, api_name="/regenerate_answer")
    assert "Done" in status and "api versions two" not in transcript and events["tokens"]
    assert messages_of(store, "api versions one") == [("user", "api versions one"), ("assistant", "api versions one")]
    (summary,) = [s for s in store.list_conversations() if s.title == "api versions one"]
    assert len(store.get_conversation(summary.id).every) == 7  # 2 exchanges, the edited one, the new answer


def test_edit_and_resend_through_the_app_replaces_the_exchange(served):
    url, store = served
    c = client(url)
    c.predict("edit test one", *SETTINGS, api_name="/send")
    c.predict("edit test tpyo", *SETTINGS, api_name="/send")
    transcript, status, box = c.predict(True, api_name="/edit_last")[:3]
    assert box == "edit test tpyo" and "Editing" in status
    assert transcript.count("ls-editing") == 2 and "tpyo" in transcript  # in view, marked as being edited
    transcript, *_ = c.predict("edit test typo", *SETTINGS, api_name="/send")
    assert "tpyo" not in transcript and transcript.count("edit test typo") >= 1
    assert messages_of(store, "edit test one") == [
        ("user", "edit test one"),
        ("assistant", "edit test one"),
        ("user", "edit test typo"),
        ("assistant", "edit test typo"),
    ]


def test_switching_streams_a_progress_bar(served):
    url, _store = served
    c = client(url)
    job = c.submit("slow", api_name="/switch_model")
    outputs = job.result() and job.outputs()
    statuses = [out[0] for out in outputs]
    bars = [
        tuple(int(x) for x in m.groups()) for s in statuses for m in [re.search(r'max="(\d+)" value="(\d+)"', s)] if m
    ]
    assert bars[0] == (3, 0) and bars[-1] == (3, 3) and len(bars) == 4, statuses
    assert "Loaded slow" in statuses[-1]
    c.submit("echo", api_name="/switch_model").result()
