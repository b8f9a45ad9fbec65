"""Reliability: the app keeps working and says what happened when a tab, an API caller or a file misbehaves.

An in-process app (Blocks launched on a free 127.0.0.1 port) over two pairs that share the tiny models: 'tiny'
(n-gram and draft) and 'tiny-ngram' (n-gram only), driven through gradio_client.
"""
from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from .apphelpers import free_port, send


def two_pair_manager(tiny_session):
    from localspec.chat import ChatSession
    from localspec.ui.manager import ModelManager

    pair = tiny_session.loaded.spec
    pairs = [pair, replace(pair, name="tiny-ngram", draft=None, default_proposer="ngram")]

    def factory(spec, progress):
        progress(f"loading {spec.name}")
        return ChatSession(replace(tiny_session.loaded, spec=spec))

    manager = ModelManager(pairs, factory)
    manager.load(pair.name)
    return manager


@pytest.fixture(scope="module")
def inproc_app(tiny_session):
    from localspec.ui import build_app

    manager = two_pair_manager(tiny_session)
    demo = build_app(manager)
    demo.queue(default_concurrency_limit=None)
    port = free_port()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True, share=False)
    yield SimpleNamespace(url=f"http://127.0.0.1:{port}/", manager=manager, demo=demo)
    demo.close()


@pytest.fixture
def api(inproc_app):
    from gradio_client import Client

    inproc_app.manager.load("tiny")
    return Client(inproc_app.url, verbose=False)


# -- 5: API callers see the app's own validation messages -------------------------------------------------------------

@pytest.mark.parametrize("kwargs, words", [
    ({"message": "   "}, "the message is empty"),
    ({"k": 2.5}, "K must be a whole number"),
    ({"seed": -1}, "seed must be a whole number from 0"),
    ({"max_new": 0}, "max new tokens must be a whole number ≥ 1"),
])
def test_rejected_send_gives_api_callers_the_message(api, kwargs, words):
    message = kwargs.pop("message", "hello")
    transcript, stats, status, events, box = send(api, message, **kwargs).result(timeout=60)
    assert words in status
    assert isinstance(transcript, str) and isinstance(stats, str) and box == message
    assert events is None or isinstance(events, dict) and "props" not in events


# -- 10: switch_model(None) is refused ---------------------------------------------------------------------------------

def test_switch_to_nothing_is_refused(api, inproc_app):
    status, model, _proposer, _k = api.predict(None, api_name="/switch_model")
    assert "Loaded" not in status and "Could not switch" in status
    assert model == "tiny" and inproc_app.manager.name == "tiny"


def test_switch_handler_refuses_none(tiny_session):
    from localspec.ui.handlers import Handlers

    handlers = Handlers(two_pair_manager(tiny_session))
    status, model, *_ = list(handlers.switch(None))[-1]
    assert "choose a model pair" in status and model == "tiny"
