"""A model's chat template, a tokenization or a truncation never holds the engine's queue, and each is bounded: a
template that loops for ever is stopped at the prompt's time limit with a message naming it, Stop ends it at once,
the answers behind it (chat window and API) go first, and a prefill looks at its cancel flag between chunks."""

from __future__ import annotations

import asyncio
import copy
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest

from localspec.config import SamplingParams
from localspec.models.work_budget import BudgetSpent
from localspec.server.admission import Admission
from tests.support import wait_until

CHAT = [{"role": "user", "content": "hello"}]
LOOPS = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}never"  # 10^10 turns
LOCAL = "http://127.0.0.1:8000"
GUARD_S = 60  # only a broken build waits this long: the checks below end on events, not on time


def hostile_session(tiny_session, name: str = "hostile"):
    """A session of the tiny pair whose tokenizer's chat template loops 10^10 times."""
    from localspec.chat import ChatSession

    session = ChatSession(replace(tiny_session.loaded, spec=replace(tiny_session.loaded.spec, name=name)))
    session.tokenizer = copy.deepcopy(tiny_session.tokenizer)
    session.tokenizer.chat_template = LOOPS
    return session


def test_a_looping_template_stops_at_the_time_limit_naming_it(tiny_session, monkeypatch):
    monkeypatch.setattr("localspec.chat.PROMPT_LIMIT_S", 0.2)
    session = hostile_session(tiny_session)
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(session.prompt_ids, CHAT, 8)
        with pytest.raises(BudgetSpent) as caught:
            future.result(GUARD_S)
    assert caught.value.reason == "time"
    assert "the chat template of 'hostile' took longer than 0.2 s" in str(caught.value)


def test_the_api_answers_400_naming_the_template(tiny_session, monkeypatch):
    from fastapi.testclient import TestClient

    from localspec.server.app import create_app
    from localspec.server.runner import FixedBackend

    monkeypatch.setattr("localspec.chat.PROMPT_LIMIT_S", 0.2)
    session = hostile_session(tiny_session, "tiny")
    admission = Admission(4)
    app = create_app(FixedBackend([session.loaded.spec], "tiny", session), admission, None, None)
    with TestClient(app, base_url=LOCAL) as client, ThreadPoolExecutor(1) as pool:
        body = {"model": "tiny", "messages": CHAT, "max_tokens": 4}
        r = pool.submit(client.post, "/v1/chat/completions", json=body).result(GUARD_S)
        assert r.status_code == 400 and "the chat template of 'tiny'" in r.json()["error"]["message"]
        # the completions route runs no template: it answers, and nothing was left in the queue
        ok = client.post("/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 4})
        assert ok.status_code == 200, ok.text
    assert admission.waiting == 0 and admission.running == 0


def test_stop_ends_a_looping_template_and_the_engine_stays_free(tiny_session):
    """The window's path: the hostile pair picked, then "hello". While its template loops the engine is free for the
    request behind it; Stop ends the template at once; switching to the other pair then works."""
    from localspec.chat import ChatSession
    from localspec.ui.manager import ModelManager

    good = tiny_session.loaded.spec
    hostile = replace(good, name="hostile")

    def factory(spec, progress):
        return hostile_session(tiny_session) if spec.name == "hostile" else ChatSession(tiny_session.loaded)

    admission = Admission(4)
    manager = ModelManager([good, hostile], factory, admission)
    manager.load("hostile")
    cancel = threading.Event()
    out = manager.answer(CHAT, SamplingParams(max_new_tokens=4), lambda s: s.default_spec(), cancel, owner="tab")
    wait_until(lambda: admission.waiting == 1, GUARD_S, "the answer's place in the queue")
    behind = admission.enter("api")
    assert admission.wait(behind, GUARD_S)  # the request behind the template's answer takes the engine
    admission.leave(behind)
    assert manager.cancel("tab")  # Stop
    kinds, texts = [], []
    while (msg := out.get(timeout=GUARD_S)).kind != "done":
        kinds.append(msg.kind)
        texts.append(msg.text)
    assert kinds == ["error"] and "stopped" in texts[0]
    manager.load(good.name)
    assert manager.name == good.name
    out = manager.answer(CHAT, SamplingParams(max_new_tokens=4), lambda s: s.default_spec(), threading.Event())
    kinds = []
    while (msg := out.get(timeout=GUARD_S)).kind != "done":
        kinds.append(msg.kind)
    assert "event" in kinds and "error" not in kinds


def test_an_api_prompt_being_built_does_not_hold_the_request_behind_it(tiny_session, monkeypatch):
    from localspec.server.runner import FixedBackend, Job
    from localspec.server.schemas import parse_request

    release = threading.Event()
    original = tiny_session.prompt_ids

    def slow(*args, **kwargs):  # a long truncation or template, held until the request behind has its answer
        release.wait(GUARD_S)
        return original(*args, **kwargs)

    monkeypatch.setattr(tiny_session, "prompt_ids", slow)
    admission = Admission(4)
    backend = FixedBackend([tiny_session.loaded.spec], tiny_session.loaded.spec.name, tiny_session)
    chat = parse_request({"model": "tiny", "messages": CHAT, "max_tokens": 4}, "chat")
    plain = parse_request({"model": "tiny", "prompt": "hi", "max_tokens": 4}, "completions")

    async def items(job):
        out = []
        while (item := await asyncio.wait_for(job.items.get(), GUARD_S))[0] != "end":
            out.append(item[0])
        return out

    async def run():
        first = Job(chat, backend, admission, None)
        second = Job(plain, backend, admission, None)
        behind = await items(second)  # before the first one's prompt is ready
        release.set()
        return behind, await items(first)

    try:
        behind, front = asyncio.run(run())
    finally:
        release.set()
    assert "event" in behind and "error" not in behind
    assert "event" in front and "error" not in front


def test_a_prepared_ticket_goes_before_one_still_preparing():
    admission = Admission(4)
    preparing, ready = admission.enter("chat"), admission.enter("api")
    assert admission.wait(ready, GUARD_S) and admission.running == 1 and admission.waiting == 1
    admission.step_back(ready)  # its prompt went out of date: first in line again, not ready
    assert admission.running == 0 and admission.waiting == 2
    assert admission.wait(preparing, GUARD_S)
    admission.leave(preparing)
    assert admission.wait(ready, GUARD_S)
    admission.leave(ready)
    assert admission.waiting == 0 and admission.running == 0


def test_a_cancel_during_a_long_prefill_stops_it_between_chunks(tiny_session, monkeypatch):
    from localspec.config import SpecConfig

    monkeypatch.setattr("localspec.engine.loop.PREFILL_CHUNK", 80)
    engine = tiny_session.engine
    cancel = threading.Event()
    rows = []
    original = engine.target.extend

    def extend(token_ids, *args, **kwargs):
        rows.append(len(token_ids))
        cancel.set()  # the client goes away during the first forward
        return original(token_ids, *args, **kwargs)

    monkeypatch.setattr(engine.target, "extend", extend)
    prompt = [(7 * i) % 250 + 3 for i in range(400)]
    events = list(engine.generate(prompt, SamplingParams(max_new_tokens=4), SpecConfig(proposer="none"), None, cancel))
    assert rows == [80]  # the rest of the prompt was never run
    assert events[-1].finish_reason == "cancelled" and not any(e.tokens for e in events)
