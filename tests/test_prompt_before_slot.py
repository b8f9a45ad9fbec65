"""The chat template and truncation run before a request takes the one engine slot (API and chat window), so a long
conversation never holds up the request in front of it; a client gone while it waits ends it."""

from __future__ import annotations

import asyncio
import threading
import time

from localspec.config import SamplingParams
from localspec.server.admission import Admission

CHAT = [{"role": "user", "content": "Say something."}]


def spy_prompts(session, monkeypatch) -> threading.Event:
    called = threading.Event()
    original = session.prompt_ids

    def spy(*args, **kwargs):
        called.set()
        return original(*args, **kwargs)

    monkeypatch.setattr(session, "prompt_ids", spy)
    return called


def test_the_chat_window_tokenizes_while_it_waits(tiny_session, monkeypatch):
    from localspec.ui.manager import ModelManager

    admission = Admission(4)
    manager = ModelManager([tiny_session.loaded.spec], lambda spec, progress: tiny_session, admission)
    manager.load(None)
    called = spy_prompts(tiny_session, monkeypatch)
    holder = admission.enter("api")
    assert admission.wait(holder, 0)
    out = manager.answer(CHAT, SamplingParams(max_new_tokens=4), lambda s: s.default_spec(), threading.Event())
    try:
        assert called.wait(10)  # while the engine is still held by the request in front
        assert admission.waiting == 1
    finally:
        admission.leave(holder)
    kinds = []
    while (msg := out.get(timeout=30)).kind != "done":
        kinds.append(msg.kind)
    assert "event" in kinds and "error" not in kinds


def test_the_api_tokenizes_while_it_waits_and_a_cancel_ends_the_wait(tiny_session, monkeypatch):
    from localspec.server.runner import FixedBackend, Job
    from localspec.server.schemas import parse_request

    admission = Admission(4)
    backend = FixedBackend([tiny_session.loaded.spec], tiny_session.loaded.spec.name, tiny_session)
    called = spy_prompts(tiny_session, monkeypatch)
    request = parse_request({"model": "tiny", "messages": CHAT, "max_tokens": 4}, "chat")
    holder = admission.enter("chat")
    assert admission.wait(holder, 0)

    async def run():
        job = Job(request, backend, admission, None)
        deadline = time.monotonic() + 10
        while not job.prompt_tokens and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        tokenized_while_held = called.is_set() and admission.running == 1 and job.prompt_tokens > 0
        job.cancel.set()  # the client went away while waiting: the job leaves the queue, the engine never runs
        items = [await asyncio.wait_for(job.items.get(), 10)]
        return tokenized_while_held, items

    try:
        tokenized, items = asyncio.run(run())
    finally:
        admission.leave(holder)
    assert tokenized
    assert items == [("end", None)] and admission.waiting == 0
