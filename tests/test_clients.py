"""Real clients against a real server (uvicorn on a free 127.0.0.1 port): the official openai package (sync, async,
streaming, completions with many stops) and langchain-openai (invoke, stream, a second system message); a client
that times out on a non-streamed request ends quietly and is counted as cancelled."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from .test_server import live_server  # noqa: F401  (the fixture)

pytestmark = pytest.mark.slow  # a real server in a thread, real HTTP

SYSTEM = [
    {"role": "system", "content": "You are terse."},
    {"role": "system", "content": "Earlier: the user asked about tea."},
    {"role": "user", "content": "Say something."},
]


def test_openai_sync_async_and_many_stops(live_server):  # noqa: F811
    import openai

    url, _admission, _metrics = live_server
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused")
    whole = client.chat.completions.create(model="tiny", messages=SYSTEM, max_tokens=8, temperature=0)
    assert whole.choices[0].finish_reason in ("stop", "length") and whole.system_fingerprint.startswith("localspec:")
    assert client.models.retrieve("tiny").id == "tiny"
    stops = [f"<s{i}>" for i in range(7)]  # Continue's autocomplete sends this many
    done = client.completions.create(model="tiny", prompt="def f(", max_tokens=6, temperature=0, stop=stops)
    assert done.choices[0].finish_reason in ("stop", "length")

    async def streamed() -> tuple[str, object]:
        aclient = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused")
        stream = await aclient.chat.completions.create(
            model="tiny",
            messages=SYSTEM,
            max_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        text, usage = "", None
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
            usage = chunk.usage or usage
        await aclient.close()
        return text, usage

    text, usage = asyncio.run(streamed())
    assert text == whole.choices[0].message.content
    assert usage.prompt_tokens == whole.usage.prompt_tokens and usage.completion_tokens == whole.usage.completion_tokens


def test_langchain_openai_invoke_and_stream(live_server):  # noqa: F811
    pytest.importorskip("langchain_openai", reason="langchain-openai is in requirements-test.lock: make setup-test")
    from langchain_core.messages import HumanMessage, SystemMessage
    from langchain_openai import ChatOpenAI

    url, _admission, _metrics = live_server
    llm = ChatOpenAI(model="tiny", base_url=url + "/v1", api_key="unused", temperature=0, max_tokens=8)
    messages = [SystemMessage("You are terse."), SystemMessage("Summary: tea."), HumanMessage("Say something.")]
    reply = llm.invoke(messages)
    assert reply.content and reply.response_metadata["finish_reason"] in ("stop", "length")
    one_system = llm.invoke([messages[0], messages[2]])
    assert reply.usage_metadata["input_tokens"] > one_system.usage_metadata["input_tokens"]  # the second one counts
    streamed = "".join(chunk.content for chunk in llm.stream(messages))
    assert streamed == reply.content


def test_a_client_that_times_out_ends_quietly_and_counts_as_cancelled(live_server, tiny_session, monkeypatch, caplog):  # noqa: F811
    import httpx

    url, admission, metrics = live_server
    monkeypatch.setattr(tiny_session.engine, "stop_token_ids", frozenset())  # only the client's going ends it
    target = tiny_session.engine.target
    extend = target.extend

    def slow_extend(*args, **kwargs):  # the tiny model writes 900 tokens in under the timeout on a fast idle CPU
        time.sleep(0.005)
        return extend(*args, **kwargs)

    monkeypatch.setattr(target, "extend", slow_extend)  # ≥ 4.5 s for the answer, whatever the CPU
    caplog.set_level(logging.ERROR)
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "go"}],
        "max_tokens": 900,
        "temperature": 1.0,
        "localspec": {"proposer": "none"},
    }
    with pytest.raises(httpx.TimeoutException):
        httpx.post(url + "/v1/chat/completions", json=body, timeout=1.0)
    deadline = time.time() + 30
    while (admission.running or 'finished_reason="cancelled"' not in metrics.exposition().decode()) and (
        time.time() < deadline
    ):
        time.sleep(0.05)
    assert admission.running == 0
    assert 'finished_reason="cancelled"' in metrics.exposition().decode()
    assert not [r for r in caplog.records if "Exception in ASGI application" in r.getMessage()]
