"""Tools and structured output through real client libraries against a real server: the openai SDK's `tools` with
streaming (the SDK assembles the tool-call deltas), an Open WebUI-style native tool-calling round trip (streamed
calls, the tool's result sent back as a `role: "tool"` message, a streamed answer), langchain-openai's `bind_tools`
round trip and `with_structured_output` (json_schema and json_mode). The tiny random model writes nonsense, so
the calls and the JSON are forced by tool_choice or a schema: valid by construction, and the clients check them."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Literal

import pytest

from .test_server import live_server  # noqa: F401  (the fixture)
from .test_tools_api import ASK, TIME, WEATHER

pytestmark = pytest.mark.slow  # a real server in a thread, real HTTP

NAMED = {"type": "function", "function": {"name": "get_weather"}}


def test_openai_sdk_streams_tool_calls_and_assembles_them(live_server):  # noqa: F811
    import openai

    url, _admission, _metrics = live_server
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused")
    whole = client.chat.completions.create(
        model="tiny", messages=ASK, tools=[TIME, WEATHER], tool_choice=NAMED, max_tokens=80, temperature=0
    )
    (call,) = whole.choices[0].message.tool_calls
    assert whole.choices[0].finish_reason == "tool_calls" and call.function.name == "get_weather"
    with client.chat.completions.stream(
        model="tiny", messages=ASK, tools=[TIME, WEATHER], tool_choice=NAMED, max_tokens=80, temperature=0
    ) as stream:
        for _event in stream:
            pass
        final = stream.get_final_completion()  # the SDK's own assembly of the streamed deltas
    (streamed,) = final.choices[0].message.tool_calls
    assert final.choices[0].finish_reason == "tool_calls"
    assert streamed.function.name == call.function.name and streamed.function.arguments == call.function.arguments
    assert json.loads(streamed.function.arguments)["city"] in ("Paris", "Rome") and streamed.id.startswith("call_")


def test_open_webui_style_native_tool_calling_round_trip(live_server):  # noqa: F811
    """Open WebUI's native function calling: stream with tools, run the call, send the result back as a tool
    message in the same conversation, stream the answer."""
    import openai

    url, _admission, _metrics = live_server
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused")
    chunks = list(
        client.chat.completions.create(
            model="tiny",
            messages=ASK,
            tools=[WEATHER],
            tool_choice="required",
            max_tokens=80,
            temperature=0,
            stream=True,
        )
    )
    deltas = [c.choices[0] for c in chunks if c.choices]
    parts = [part for d in deltas for part in (d.delta.tool_calls or [])]
    assert parts and deltas[-1].finish_reason == "tool_calls"
    name = "".join(p.function.name or "" for p in parts if p.function)
    arguments = "".join(p.function.arguments or "" for p in parts if p.function)
    assert name == "get_weather" and json.loads(arguments)["city"] in ("Paris", "Rome")
    history = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": parts[0].id, "type": "function", "function": {"name": name, "arguments": arguments}}],
        },
        {"role": "tool", "tool_call_id": parts[0].id, "content": "sunny, 24 C"},
    ]
    answer = client.chat.completions.create(
        model="tiny", messages=history, tools=[WEATHER], max_tokens=12, temperature=0, stream=True
    )
    finish = [c.choices[0].finish_reason for c in answer if c.choices and c.choices[0].finish_reason]
    assert finish and finish[-1] in ("stop", "length", "tool_calls")


def test_langchain_bind_tools_round_trip(live_server):  # noqa: F811
    pytest.importorskip("langchain_openai", reason="langchain-openai is in requirements-test.lock: make setup-test")
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_weather(city: Literal["Paris", "Rome"]) -> str:  # a closed set: the random model's strings never end
        """The weather in a city."""
        return f"sunny in {city}"

    url, _admission, _metrics = live_server
    llm = ChatOpenAI(model="tiny", base_url=url + "/v1", api_key="unused", temperature=0, max_tokens=120)
    messages = [HumanMessage("What is the weather in Paris?")]
    # strict: no other keys (additionalProperties false), which the random model would otherwise write for ever
    asked = llm.bind_tools([get_weather], tool_choice="get_weather", strict=True).invoke(messages)
    (call,) = asked.tool_calls  # parsed by langchain from the API's tool_calls
    assert call["name"] == "get_weather" and call["args"]["city"] in ("Paris", "Rome") and not asked.invalid_tool_calls
    messages += [asked, ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"])]
    answer = llm.bind_tools([get_weather]).invoke(messages)
    assert answer.response_metadata["finish_reason"] in ("stop", "length", "tool_calls")
    assert answer.usage_metadata["input_tokens"] > asked.usage_metadata["input_tokens"]  # the result was read


def test_langchain_with_structured_output_json_schema_and_json_mode(live_server, tiny_session, monkeypatch):  # noqa: F811
    import torch

    pytest.importorskip("langchain_openai", reason="langchain-openai is in requirements-test.lock: make setup-test")
    from langchain_openai import ChatOpenAI
    from pydantic import BaseModel, Field

    class City(BaseModel):
        """A city and its size."""

        name: Literal["Paris", "Rome"]
        rank: int = Field(ge=1, le=9)

    url, _admission, _metrics = live_server
    llm = ChatOpenAI(model="tiny", base_url=url + "/v1", api_key="unused", temperature=0, max_tokens=60)
    city = llm.with_structured_output(City, method="json_schema").invoke("A big city?")
    assert isinstance(city, City)  # langchain parsed and validated it against the schema
    # any object: the random model would write one key's string for ever, so it is made a model that prefers '}'
    close = tiny_session.tokenizer.convert_tokens_to_ids("}")
    target = tiny_session.engine.target
    extend = target.extend

    def prefers_closing(*args, **kwargs):
        out = extend(*args, **kwargs)
        if out.logits is None:
            return out
        bias = torch.zeros(out.logits.shape[-1], dtype=out.logits.dtype)
        bias[close] = 100.0
        return replace(out, logits=out.logits + bias.to(out.logits.device))

    monkeypatch.setattr(target, "extend", prefers_closing)
    plain = llm.bind(extra_body={"localspec": {"proposer": "none"}})  # every target forward is an extend()
    raw = plain.with_structured_output(None, method="json_mode", include_raw=True).invoke("A city as JSON?")
    assert raw["parsing_error"] is None and isinstance(raw["parsed"], dict), raw
