"""Tools and structured output through the API: response_format by constrained decoding, tool_choice required /
named as constrained tool calls (whole and streamed), tool messages in the prompt (the generic format, and a
template's own `tools` section), and a 400 naming each bad field."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from localspec.server.admission import Admission

LOCAL = "http://127.0.0.1:8000"
MODEL = "tiny"
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"enum": ["Paris", "Rome"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}, "additionalProperties": False}},
}
RECORD = {
    "type": "object",
    "properties": {"name": {"enum": ["ab", "cd"]}, "n": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["name", "n"],
    "additionalProperties": False,
}


@pytest.fixture()
def api(tiny_session):
    from fastapi.testclient import TestClient

    from localspec.server.app import create_app
    from localspec.server.runner import FixedBackend

    admission = Admission(4)
    app = create_app(FixedBackend([tiny_session.loaded.spec], MODEL, tiny_session), admission, None, None)
    with TestClient(app, base_url=LOCAL) as client:
        yield client


def chat(**extra) -> dict:
    return {"model": MODEL, "messages": ASK, "max_tokens": 120, "temperature": 0, **extra}


def chunks(response) -> list[dict]:
    return [json.loads(line[6:]) for line in response.text.split("\n\n") if line.startswith("data: {")]


# ---- response_format --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("proposer", ["none", "ngram", "draft"])
def test_a_json_schema_answer_validates_and_speculation_does_not_change_it(api, proposer):
    fmt = {"type": "json_schema", "json_schema": {"name": "record", "schema": RECORD}}
    r = api.post("/v1/chat/completions", json=chat(response_format=fmt, localspec={"proposer": proposer}))
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    value = json.loads(choice["message"]["content"])
    assert choice["finish_reason"] == "stop" and set(value) == {"name", "n"} and value["name"] in ("ab", "cd")
    plain = api.post("/v1/chat/completions", json=chat(response_format=fmt, localspec={"proposer": "none"}))
    assert plain.json()["choices"][0]["message"]["content"] == choice["message"]["content"]


def test_json_object_mode_answers_an_object_and_completions_take_a_schema_too(api):
    r = api.post("/v1/chat/completions", json=chat(response_format={"type": "json_object"}, max_tokens=60))
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"].startswith("{")
    fmt = {"type": "json_schema", "json_schema": {"name": "record", "schema": RECORD}}
    body = {"model": MODEL, "prompt": "Record:", "max_tokens": 60, "temperature": 0, "response_format": fmt}
    done = api.post("/v1/completions", json=body).json()["choices"][0]
    assert done["finish_reason"] == "stop" and json.loads(done["text"])["name"] in ("ab", "cd")


# ---- tool calls ---------------------------------------------------------------------------------------------------
def test_tool_choice_required_answers_a_tool_call(api):
    r = api.post(
        "/v1/chat/completions", json=chat(tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=False)
    )
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None, choice
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] in ("get_weather", "get_time")
    assert isinstance(json.loads(call["function"]["arguments"]), dict)


def test_a_named_tool_choice_calls_that_function_and_streams_it_as_a_delta(api):
    named = {"type": "function", "function": {"name": "get_weather"}}
    body = chat(tools=[TIME, WEATHER], tool_choice=named, parallel_tool_calls=False, stream=True)
    r = api.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    deltas = [c["choices"][0] for c in chunks(r) if c["choices"]]
    calls = [call for d in deltas for call in d["delta"].get("tool_calls", [])]
    assert [c["index"] for c in calls] == [0] and calls[0]["function"]["name"] == "get_weather"
    assert json.loads(calls[0]["function"]["arguments"])["city"] in ("Paris", "Rome")
    assert deltas[-1]["finish_reason"] == "tool_calls"
    assert "<tool_call>" not in "".join(d["delta"].get("content") or "" for d in deltas)


def test_tool_messages_reach_the_prompt_in_the_generic_format(api, tiny_session, monkeypatch):
    seen = []
    original = tiny_session.prompt_ids

    def spy(messages, *args, **kwargs):
        seen.append((messages, kwargs.get("tools")))
        return original(messages, *args, **kwargs)

    monkeypatch.setattr(tiny_session, "prompt_ids", spy)
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}
    history = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 24 C"},
    ]
    assert api.post("/v1/chat/completions", json=chat(messages=history, tools=[WEATHER])).status_code == 200
    messages, tools = seen[-1]
    assert tools is None and messages[0]["role"] == "system"  # the tiny template has no tools section
    assert '"name": "get_weather"' in messages[0]["content"] and "<tool_call>" in messages[0]["content"]
    assert messages[2] == {
        "role": "assistant",
        "content": '<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>',
    }
    assert messages[3] == {"role": "user", "content": "<tool_response>\nsunny, 24 C\n</tool_response>"}
    api.post("/v1/chat/completions", json=chat(tools=[WEATHER], tool_choice="none"))
    assert seen[-1][0] == ASK  # none: no function is offered


NATIVE = (
    "{% if tools %}<|im_start|>system\nTOOLS:{% for t in tools %} {{ t.function.name }}{% endfor %}<|im_end|>\n"
    "{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{% for c in m.tool_calls or [] %}CALL {{ c.function.name }} {{ c.function.arguments.city }}{% endfor %}"
    "<|im_end|>\n{% endfor %}<|im_start|>assistant\n"
)


def test_a_template_with_a_tools_section_gets_the_tools_and_the_calls_as_objects(tiny_session, monkeypatch):
    from localspec.server.runner import template_input
    from localspec.server.schemas import parse_request

    monkeypatch.setattr(tiny_session.tokenizer, "chat_template", NATIVE)
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}
    history = [*ASK, {"role": "assistant", "tool_calls": [call]}, {"role": "tool", "content": "sunny"}]
    request = parse_request(chat(messages=history, tools=[WEATHER, TIME]), "chat")
    messages, tools = template_input(request, tiny_session.tokenizer)
    assert [t["function"]["name"] for t in tools] == ["get_weather", "get_time"]
    ids, _ = tiny_session.prompt_ids(messages, 16, tools=tools)
    text = tiny_session.tokenizer.decode(ids)
    assert "TOOLS: get_weather get_time" in text and "CALL get_weather Rome" in text and "tool\nsunny" in text


# ---- bad fields -----------------------------------------------------------------------------------------------------
BAD = [
    ({"tools": [{"type": "function", "function": {"name": "no spaces"}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0]"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "other"}}}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": []}}}, "response_format.json_schema"),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "nonsense"}}}},
        "response_format.json_schema.schema",
    ),
    (
        {"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}},
        "response_format",
    ),
    ({"messages": [*ASK, {"role": "user", "content": "x", "tool_calls": [{}]}]}, "messages[1].tool_calls"),
]


@pytest.mark.parametrize("extra, param", BAD, ids=[p for _, p in BAD])
def test_bad_tool_and_format_fields_are_a_400_naming_the_field(api, extra, param):
    r = api.post("/v1/chat/completions", json=chat(**extra))
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_tools_on_completions_and_required_without_tools_are_refused_saying_why(api):
    r = api.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "tools": [WEATHER]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools"
    assert "/v1/chat/completions" in r.json()["error"]["message"]
    r = api.post("/v1/chat/completions", json=chat(tool_choice="required"))
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"
    assert "needs tools" in r.json()["error"]["message"]


def test_unused_names_are_fine(tiny_session):
    from localspec.server.schemas import parse_request

    request = parse_request(chat(tools=[], tool_choice="auto", response_format={"type": "text"}), "chat")
    assert request.tools is None and request.constraint is None
    assert replace(request).messages == tuple(ASK)
