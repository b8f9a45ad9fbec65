"""The API as real clients use it: system messages, over-long prompts, metrics that agree with the answers, the
OpenAI-shaped 404 / model routes / health, stop strings, sampling fields, fingerprint, stream framing, slug ids."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from localspec.server.admission import Admission
from localspec.server.metrics import MetricsRecorder

from .test_server import CHAT, LOCAL, body

DISPLAY = "Tiny Pair (test)"


@pytest.fixture()
def api(tiny_session):
    """The tiny pair under a display name with spaces and parentheses (its id is the slug)."""
    from fastapi.testclient import TestClient

    from localspec.server.app import create_app
    from localspec.server.runner import FixedBackend

    admission = Admission(4)
    metrics = MetricsRecorder(admission)
    pair = replace(tiny_session.loaded.spec, name=DISPLAY)
    app = create_app(FixedBackend([pair], DISPLAY, tiny_session), admission, metrics, None)
    with TestClient(app, base_url=LOCAL) as c:
        c.admission, c.metrics = admission, metrics
        yield c


def chat(**extra):
    return body(**{"model": "tiny-pair-test", **extra})


def samples(metrics: MetricsRecorder) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def total(found: dict, name: str, **labels) -> float:
    return sum(
        v
        for (n, ls), v in found.items()
        if n == "localspec:" + name and all((k, val) in ls for k, val in labels.items())
    )


# ---- ids ---------------------------------------------------------------------------------------------------------
def test_slug_id_and_display_name_are_both_accepted(api):
    listed = api.get("/v1/models").json()["data"]
    assert [m["id"] for m in listed] == ["tiny-pair-test"] and listed[0]["localspec"]["name"] == DISPLAY
    assert listed[0]["created"] > 1_700_000_000  # a real time, not 0
    for model in ("tiny-pair-test", DISPLAY):
        assert api.post("/v1/chat/completions", json=chat(model=model)).status_code == 200, model
    one = api.get("/v1/models/tiny-pair-test")
    assert one.status_code == 200 and one.json()["id"] == "tiny-pair-test"
    assert api.get(f"/v1/models/{DISPLAY}").json()["id"] == "tiny-pair-test"
    missing = api.get("/v1/models/nope")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


def test_unknown_routes_get_an_openai_404_and_health_says_loaded(api):
    r = api.get("/v1/nothing-here")
    assert r.status_code == 404 and set(r.json()["error"]) == {"message", "type", "param", "code"}
    assert api.put("/v1/chat/completions").json()["error"]["message"].startswith("PUT is not allowed")
    health = api.get("/health")
    assert health.status_code == 200 and health.json() == {"status": "ok", "model": "tiny-pair-test"}


def test_health_without_a_model(tiny_session):
    from fastapi.testclient import TestClient

    from localspec.server.app import create_app

    class Empty:
        pairs = [tiny_session.loaded.spec]

        def current(self):
            return None, None

    with TestClient(create_app(Empty(), Admission(1), None, None), base_url=LOCAL) as c:
        r = c.get("/health")
    assert r.status_code == 503 and r.json()["status"] == "no_model"


# ---- messages --------------------------------------------------------------------------------------------------
def test_a_second_system_message_counts(api):
    one = [{"role": "system", "content": "Be brief."}, *CHAT]
    two = [one[0], {"role": "system", "content": "Summary of earlier talk: the user likes tea and cakes."}, *CHAT]
    first = api.post("/v1/chat/completions", json=chat(messages=one)).json()["usage"]["prompt_tokens"]
    second = api.post("/v1/chat/completions", json=chat(messages=two)).json()["usage"]["prompt_tokens"]
    assert second > first


def test_an_over_long_chat_is_a_400_unless_truncation_is_asked_for(api):
    long = [{"role": "user", "content": "word " * 3000}]
    r = api.post("/v1/chat/completions", json=chat(messages=long))
    error = r.json()["error"]
    assert r.status_code == 400 and error["code"] == "context_length_exceeded" and error["param"] == "messages"
    assert "tokens" in error["message"] and "truncate" in error["message"]
    ok = api.post("/v1/chat/completions", json=chat(messages=long, localspec={"truncate": True}))
    assert ok.status_code == 200 and "only its end was kept" in ok.json()["localspec"]["notice"]
    streamed = api.post("/v1/chat/completions", json=chat(messages=long, stream=True, localspec={"truncate": True}))
    first = json.loads(streamed.text.split("\n\n")[0][6:])
    assert "only its end was kept" in first["localspec"]["notice"]


def test_user_and_name_are_ignored_a_tool_call_without_its_function_refused(api):
    named = [{"role": "user", "content": "Say something.", "name": "alice"}]
    assert api.post("/v1/chat/completions", json=chat(messages=named, user="u-1")).status_code == 200
    tools = [*CHAT, {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function"}]}]
    tools.append({"role": "user", "content": "and?"})
    r = api.post("/v1/chat/completions", json=chat(messages=tools))
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[1].tool_calls[0].function"


# ---- sampling fields and stops ---------------------------------------------------------------------------------
def test_top_k_reaches_the_sampler(api, tiny_session, monkeypatch):
    seen = []
    original = tiny_session.stream_ids

    def spy(ids, sampling, spec, cancel=None):
        seen.append(sampling.top_k)
        return original(ids, sampling, spec, cancel)

    monkeypatch.setattr(tiny_session, "stream_ids", spy)
    assert api.post("/v1/chat/completions", json=chat(top_k=5)).status_code == 200
    assert api.post("/v1/chat/completions", json=chat(top_k=-1)).status_code == 200  # vLLM's "off"
    assert seen == [5, 0]
    bad = api.post("/v1/chat/completions", json=chat(top_k=-3))
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "top_k"


def test_min_p_would_change_the_output_and_is_refused_by_name(api):
    r = api.post("/v1/chat/completions", json=chat(min_p=0.05))
    assert r.status_code == 400 and r.json()["error"]["param"] == "min_p" and "min_p" in r.json()["error"]["message"]
    assert api.post("/v1/chat/completions", json=chat(min_p=0)).status_code == 200


def test_penalties_reach_the_sampler_and_change_the_answer(api, tiny_session, monkeypatch):
    seen = []
    original = tiny_session.stream_ids

    def spy(ids, sampling, spec, cancel=None):
        seen.append((sampling.repetition_penalty, sampling.frequency_penalty, sampling.presence_penalty))
        return original(ids, sampling, spec, cancel)

    monkeypatch.setattr(tiny_session, "stream_ids", spy)
    greedy = dict(temperature=0, max_tokens=32)
    plain = api.post("/v1/chat/completions", json=chat(**greedy)).json()
    penalised = dict(repetition_penalty=1.3, frequency_penalty=0.5, presence_penalty=-2)
    r = api.post("/v1/chat/completions", json=chat(**greedy, **penalised))
    assert r.status_code == 200
    neutral = dict(repetition_penalty=None, frequency_penalty=0, presence_penalty=None)  # what clients send
    assert api.post("/v1/chat/completions", json=chat(**greedy, **neutral)).status_code == 200
    assert seen == [(1.0, 0.0, 0.0), (1.3, 0.5, -2), (1.0, 0.0, 0.0)]
    assert r.json()["choices"][0]["message"]["content"] != plain["choices"][0]["message"]["content"]


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("repetition_penalty", 0, "must be a number > 0"),
        ("repetition_penalty", -1.2, "must be a number > 0"),
        ("frequency_penalty", 2.5, "must be between -2 and 2"),
        ("presence_penalty", -2.01, "must be between -2 and 2"),
        ("presence_penalty", "1", "must be a number"),
        ("frequency_penalty", True, "must be a number"),
    ],
)
def test_out_of_range_penalties_are_refused_by_name(api, field, value, words):
    r = api.post("/v1/chat/completions", json=chat(**{field: value}))
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == field and error["message"].startswith(f"{field} {words}"), error


def test_sixteen_stop_strings_are_accepted(api):
    stops = [f"<stop{i}>" for i in range(16)]
    assert (
        api.post("/v1/completions", json={"model": "tiny-pair-test", "prompt": "hi", "stop": stops}).status_code == 200
    )
    r = api.post("/v1/completions", json={"model": "tiny-pair-test", "prompt": "hi", "stop": stops + ["x"]})
    assert r.status_code == 400 and "at most 16" in r.json()["error"]["message"]


# ---- bodies ------------------------------------------------------------------------------------------------------
def test_system_fingerprint_names_model_dtype_and_weights(api, tiny_session):
    data = api.post("/v1/chat/completions", json=chat()).json()
    dtype = tiny_session.loaded.dtype.dtype if tiny_session.loaded.dtype is not None else "auto"
    assert data["system_fingerprint"] == f"localspec:tiny-pair-test:{dtype}:{tiny_session.loaded.quant}"
    assert data["created"] > 1_700_000_000


def test_no_empty_delta_before_the_finish_chunk(api):
    for extra in ({}, {"stop": ["e"]}):
        r = api.post("/v1/chat/completions", json=chat(stream=True, max_tokens=16, **extra))
        events = [json.loads(e[6:]) for e in r.text.split("\n\n") if e.startswith("data: {")]
        finish = [i for i, e in enumerate(events) if e["choices"] and e["choices"][0]["finish_reason"]]
        assert len(finish) == 1 and finish[0] == len(events) - 1
        for event in events[1:-1]:  # between the role chunk and the finish chunk: every chunk carries text
            assert event["choices"][0]["delta"].get("content"), (extra, event)


# ---- metrics agree with the responses --------------------------------------------------------------------------
def test_metrics_sum_to_the_responses_sent(api):
    greedy = api.post("/v1/chat/completions", json=chat(max_tokens=16)).json()
    text = greedy["choices"][0]["message"]["content"]
    assert len(text) >= 5
    stop = text[3:5]  # greedy gives the same answer again: it ends where this first occurs, by a stop string
    responses = [greedy]
    for extra in ({"stop": [stop], "max_tokens": 16}, {"max_tokens": 3}, {"temperature": 1.0, "seed": 4}):
        responses.append(api.post("/v1/chat/completions", json=chat(**extra)).json())
    streamed = api.post(
        "/v1/chat/completions",
        json=chat(stream=True, stop=[stop], max_tokens=16, stream_options={"include_usage": True}),
    )
    chunks = [json.loads(e[6:]) for e in streamed.text.split("\n\n") if e.startswith("data: {")]
    stream_finish = next(
        c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]
    )
    stream_usage = chunks[-1]["usage"]
    assert stream_finish == responses[1]["choices"][0]["finish_reason"] == "stop"
    assert stream_usage["completion_tokens"] < greedy["usage"]["completion_tokens"]
    found = samples(api.metrics)
    reasons = [r["choices"][0]["finish_reason"] for r in responses] + [stream_finish]
    assert "stop" in reasons
    for reason in set(reasons):
        assert total(found, "request_success_total", finished_reason=reason, source="api") == reasons.count(reason)
    assert total(found, "request_success_total", finished_reason="cancelled") == 0
    completion = sum(r["usage"]["completion_tokens"] for r in responses) + stream_usage["completion_tokens"]
    prompt = sum(r["usage"]["prompt_tokens"] for r in responses) + stream_usage["prompt_tokens"]
    assert total(found, "generation_tokens_total") == completion
    assert total(found, "prompt_tokens_total") == prompt
    gauges = {ls for (n, ls) in found if n in ("localspec:num_requests_running", "localspec:num_requests_waiting")}
    assert gauges == {(("model_name", DISPLAY),)}
