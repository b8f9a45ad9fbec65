"""The OpenAI-compatible API (localspec/server): shapes, validation, the shared FIFO queue, auth and /metrics.

Fast tests run the routes in-process (fastapi's TestClient) on the tiny random pair; the slow ones start a real
uvicorn server on a free 127.0.0.1 port and talk to it with the official openai package and curl.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import threading

import pytest

from localspec.config import SamplingParams
from localspec.engine.events import TOKEN_KINDS
from localspec.server.admission import Admission, QueueFull
from localspec.server.auth import api_key_for, key_matches
from localspec.server.metrics import MetricsRecorder
from tests.support import wait_until

CHAT = [{"role": "user", "content": "Say something."}]
LOCAL = "http://127.0.0.1:8000"  # the Host a loopback server accepts (server/guard.py)


def make_app(session, admission=None, metrics=None, api_key=None):
    from localspec.models.registry import load_registry  # noqa: F401  (pairs come from the session)
    from localspec.server.app import create_app
    from localspec.server.runner import FixedBackend

    admission = admission or Admission(4)
    return create_app(
        FixedBackend([session.loaded.spec], session.loaded.spec.name, session), admission, metrics, api_key
    )


@pytest.fixture()
def client(tiny_session):
    from fastapi.testclient import TestClient

    admission = Admission(4)
    metrics = MetricsRecorder(admission)
    with TestClient(make_app(tiny_session, admission, metrics), base_url=LOCAL) as c:
        c.admission, c.metrics = admission, metrics
        yield c


def body(**extra):
    return {"model": "tiny", "messages": CHAT, "max_tokens": 12, "temperature": 0, **extra}


# ---- the queue ---------------------------------------------------------------------------------------------------
def test_admission_serves_in_order_and_refuses_past_the_bound():
    admission = Admission(max_waiting=2)
    first, second = admission.enter("api"), admission.enter("chat")
    with pytest.raises(QueueFull):
        admission.enter("api")
    assert admission.wait(first, 0)
    assert not admission.wait(second, 0.01)  # first holds the engine
    assert not admission.acquire(blocking=False)  # a model load never jumps the queue
    third = admission.enter("api")  # one place freed when first took the engine
    admission.leave(first)
    assert not admission.wait(third, 0.01)  # second was there before
    assert admission.wait(second, 0)
    admission.leave(second)
    assert admission.wait(third, 0)
    admission.leave(third)
    assert admission.acquire(blocking=False) and admission.running == 1
    admission.release()


def test_chat_window_waits_behind_an_api_request(tiny_pair):
    from localspec.models.registry import load_registry
    from localspec.ui.manager import Busy, ModelManager, default_session_factory

    admission = Admission(4)
    manager = ModelManager(load_registry(tiny_pair["models_yaml"]), default_session_factory("cpu"), admission)
    manager.load(None)
    ticket = admission.enter("api")
    assert admission.wait(ticket, 0)
    out = manager.answer(CHAT, SamplingParams(max_new_tokens=4), lambda s: s.default_spec(), threading.Event())
    assert out.get(timeout=5).kind == "waiting"
    with pytest.raises(Busy):  # a model switch while anything holds or waits is refused, the queue untouched
        manager.load("tiny")
    admission.leave(ticket)
    kinds = []
    while (msg := out.get(timeout=30)).kind != "done":
        kinds.append(msg.kind)
    assert "event" in kinds and "error" not in kinds


# ---- shapes ------------------------------------------------------------------------------------------------------
def test_plain_response_is_plain_openai(client):
    r = client.post("/v1/chat/completions", json=body())
    assert r.status_code == 200, r.text
    data = r.json()
    assert data["object"] == "chat.completion" and data["choices"][0]["message"]["role"] == "assistant"
    assert "localspec" not in data["choices"][0] and set(data["usage"]) == {
        "prompt_tokens",
        "completion_tokens",
        "total_tokens",
    }
    assert data["choices"][0]["finish_reason"] in ("stop", "length")


def test_provenance_tokens_and_usage(client):
    r = client.post("/v1/chat/completions", json=body(logprobs=True, localspec={"provenance": True, "k": 2}))
    data = r.json()
    tokens = data["choices"][0]["localspec"]["tokens"]
    usage = data["usage"]
    assert len(tokens) == usage["completion_tokens"] == len(data["choices"][0]["logprobs"]["content"])
    assert {t["kind"] for t in tokens} <= set(TOKEN_KINDS)
    assert "".join(t["text"] for t in tokens) == data["choices"][0]["message"]["content"]
    assert usage["accepted_tokens"] == sum(t["kind"] == "accepted" for t in tokens)
    assert usage["acceptance_rate"] == pytest.approx(usage["accepted_tokens"] / usage["drafted_tokens"])
    assert 0 < usage["time_to_first_token_s"] < 60  # the prompt's prefill and the first step, measured
    for tok, lp in zip(tokens, data["choices"][0]["logprobs"]["content"]):
        assert lp["logprob"] == pytest.approx(__import__("math").log(tok["p_target"]))
        assert (tok["p_draft"] is not None) == (tok["kind"] == "accepted")


def test_stream_equals_non_stream_and_ends_with_done(client):
    whole = client.post("/v1/chat/completions", json=body()).json()["choices"][0]["message"]["content"]
    with client.stream(
        "POST", "/v1/chat/completions", json=body(stream=True, stream_options={"include_usage": True})
    ) as r:
        raw = "".join(r.iter_text())
    events = [e for e in raw.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]) == whole
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0


def test_prompt_reading_progress_sends_no_chunk_and_leaves_usage_alone(client, tiny_session, monkeypatch):
    from localspec.engine.events import PrefillProgress

    seen, stream_ids = [], tiny_session.stream_ids

    def spy(ids, sampling, spec, cancel=None, **constrained):
        for event in stream_ids(ids, sampling, spec, cancel, **constrained):
            seen.append(event)
            yield event

    monkeypatch.setattr(tiny_session, "stream_ids", spy)
    plain = {"provenance": True, "proposer": "none"}  # one token a step: the chunks do not depend on timing
    request = body(stream=True, stream_options={"include_usage": True}, localspec=plain)

    def streamed() -> tuple[list, dict, float]:
        """Each chunk's (content, finish reason, token ids and kinds); the usage less its time; that time."""
        seen.clear()
        with client.stream("POST", "/v1/chat/completions", json=request) as r:
            raw = "".join(r.iter_text())
        chunks = [json.loads(e[6:]) for e in raw.split("\n\n") if e and e != "data: [DONE]"]
        *answer, last = chunks
        shape = [
            (
                c["choices"][0]["delta"].get("content"),
                c["choices"][0]["finish_reason"],
                [(t["id"], t["kind"]) for t in c["choices"][0]["localspec"]["tokens"]],
            )
            for c in answer
        ]
        usage = dict(last["usage"])
        return shape, usage, usage.pop("time_to_first_token_s")

    whole, usage, _ = streamed()
    assert not any(isinstance(e, PrefillProgress) for e in seen)  # the prompt in one forward
    monkeypatch.setattr("localspec.engine.loop.PREFILL_CHUNK", 4)
    chunked, chunked_usage, first_token_s = streamed()
    assert sum(isinstance(e, PrefillProgress) for e in seen) >= 2  # the engine told the prompt's progress …
    assert chunked == whole and chunked_usage == usage  # … and the client got the same chunks, none more
    assert first_token_s > 0 and chunked_usage["completion_tokens"] == 12


def test_stop_string_cuts_the_answer(client):
    whole = client.post("/v1/chat/completions", json=body(max_tokens=24)).json()["choices"][0]["message"]["content"]
    stop = whole[4:6]
    assert len(stop) == 2
    data = client.post("/v1/chat/completions", json=body(max_tokens=24, stop=[stop])).json()
    assert data["choices"][0]["message"]["content"] == whole[: whole.find(stop)]
    assert data["choices"][0]["finish_reason"] == "stop"


def test_completions_and_models(client):
    data = client.post(
        "/v1/completions", json={"model": "tiny", "prompt": "abc", "max_tokens": 5, "temperature": 0, "logprobs": 0}
    ).json()
    assert data["object"] == "text_completion" and data["usage"]["completion_tokens"] == 5
    assert len(data["choices"][0]["logprobs"]["token_logprobs"]) == 5
    models = client.get("/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["tiny"] and models["data"][0]["localspec"]["loaded"]
    assert models["data"][0]["localspec"]["tree_nodes"] == 0  # the entry's default: chains of K


def test_top_logprobs_sorted_and_led_by_the_greedy_token(client):
    data = client.post("/v1/chat/completions", json=body(logprobs=True, top_logprobs=4)).json()
    content = data["choices"][0]["logprobs"]["content"]
    assert len(content) == data["usage"]["completion_tokens"] > 0
    for entry in content:
        top = entry["top_logprobs"]
        assert len(top) == 4 and all(set(t) == {"token", "logprob", "bytes"} for t in top)
        values = [t["logprob"] for t in top]
        assert values == sorted(values, reverse=True)
        assert top[0]["token"] == entry["token"] and top[0]["logprob"] == pytest.approx(entry["logprob"], abs=1e-5)
        assert all(t["bytes"] == list(t["token"].encode("utf-8")) for t in top)
    with client.stream("POST", "/v1/chat/completions", json=body(logprobs=True, top_logprobs=4, stream=True)) as r:
        chunks = [json.loads(e[6:]) for e in "".join(r.iter_text()).split("\n\n") if e and e != "data: [DONE]"]
    streamed = [
        e
        for c in chunks
        if c["choices"] and c["choices"][0]["logprobs"]
        for e in c["choices"][0]["logprobs"]["content"]
    ]
    assert streamed == content


def test_top_logprobs_zero_adds_nothing(client):
    plain = client.post("/v1/chat/completions", json=body(logprobs=True)).json()["choices"][0]["logprobs"]
    zero = client.post("/v1/chat/completions", json=body(logprobs=True, top_logprobs=0)).json()["choices"][0]
    assert zero["logprobs"] == plain and all(entry["top_logprobs"] == [] for entry in plain["content"])


def test_completions_logprobs_n(client):
    logprobs = client.post(
        "/v1/completions", json={"model": "tiny", "prompt": "abc", "max_tokens": 5, "temperature": 0, "logprobs": 3}
    ).json()["choices"][0]["logprobs"]
    assert len(logprobs["top_logprobs"]) == 5
    for top, lp in zip(logprobs["top_logprobs"], logprobs["token_logprobs"]):
        assert 1 <= len(top) <= 3 and max(top.values()) == pytest.approx(lp, abs=1e-5)


def test_top_logprobs_over_the_limit_names_the_field(client):
    error = client.post("/v1/chat/completions", json=body(logprobs=True, top_logprobs=21)).json()["error"]
    assert error["param"] == "top_logprobs" and error["message"].startswith("top_logprobs must be between 0 and 20")
    error = client.post("/v1/completions", json={"model": "tiny", "prompt": "abc", "logprobs": 21}).json()["error"]
    assert error["param"] == "logprobs" and error["message"].startswith("logprobs must be between 0 and 20")


@pytest.mark.parametrize(
    "extra, param, status",
    [
        ({"n": 2}, "n", 400),
        ({"temperature": 9}, "temperature", 400),
        ({"top_p": 0}, "top_p", 400),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role", 400),
        ({"messages": [{"role": "user", "content": "x" * 300_000}]}, "messages[0].content", 400),
        ({"localspec": {"k": 99}}, "localspec.k", 400),
        ({"localspec": {"tree_nodes": 33}}, "localspec.tree_nodes", 400),
        ({"localspec": {"tree_nodes": "8"}}, "localspec.tree_nodes", 400),
        ({"localspec": {"proposer": "head"}}, "localspec.proposer", 400),
        ({"top_logprobs": 21, "logprobs": True}, "top_logprobs", 400),
        ({"top_logprobs": 2}, "top_logprobs", 400),  # without logprobs: true
        ({"model": "gpt-4"}, "model", 404),
        ({"max_tokens": 0}, "max_tokens", 400),
    ],
)
def test_bad_field_gets_openai_error(client, extra, param, status):
    r = client.post("/v1/chat/completions", json=body(**extra))
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["message"] and error["type"]


@pytest.mark.parametrize("bad", [33, -1, 2.5, True])
def test_a_bad_tree_nodes_gets_the_rules_message(client, bad):
    from localspec.config import ConfigError, check_tree_nodes

    with pytest.raises(ConfigError) as rule:
        check_tree_nodes(bad, "localspec.tree_nodes")
    r = client.post("/v1/chat/completions", json=body(localspec={"tree_nodes": bad}))
    assert r.status_code == 400
    assert r.json()["error"] == {
        "message": str(rule.value),
        "type": "invalid_request_error",
        "param": "localspec.tree_nodes",
        "code": None,
    }


def test_tree_nodes_reach_the_spec(client, tiny_session, monkeypatch):
    specs, stream_ids = [], tiny_session.stream_ids

    def spy(ids, sampling, spec, cancel=None):
        specs.append(spec)
        return stream_ids(ids, sampling, spec, cancel)

    monkeypatch.setattr(tiny_session, "stream_ids", spy)
    r = client.post("/v1/chat/completions", json=body(localspec={"proposer": "ngram", "k": 2, "tree_nodes": 6}))
    assert r.status_code == 200, r.text
    assert (specs[-1].proposer, specs[-1].k, specs[-1].tree_nodes) == ("ngram", 2, 6)
    assert client.post("/v1/chat/completions", json=body(localspec={"proposer": "ngram"})).status_code == 200
    assert specs[-1].tree_nodes == tiny_session.loaded.spec.tree_nodes  # left out: the entry's


def test_queue_full_answers_429(tiny_session):
    from fastapi.testclient import TestClient

    admission = Admission(0)
    holder = admission.enter("chat")
    assert admission.wait(holder, 0)
    try:
        r = TestClient(make_app(tiny_session, admission), base_url=LOCAL).post("/v1/chat/completions", json=body())
    finally:
        admission.leave(holder)
    assert r.status_code == 429 and r.headers["retry-after"].isdigit()
    assert r.json()["error"]["code"] == "queue_full"


def test_api_key(tiny_session):
    from fastapi.testclient import TestClient

    c = TestClient(make_app(tiny_session, api_key="s3cret"), base_url=LOCAL)
    assert c.post("/v1/chat/completions", json=body()).status_code == 401
    assert c.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert c.get("/v1/models", headers={"Authorization": "Bearer s3cret"}).status_code == 200
    assert key_matches("k", "bearer k") and not key_matches("k", "k") and not key_matches("k", None)
    from localspec.config import ConfigError

    with pytest.raises(ConfigError, match="LOCALSPEC_API_KEY"):
        api_key_for("0.0.0.0", False, {})
    assert api_key_for("0.0.0.0", True, {}) is None and api_key_for("127.0.0.1", False, {}) is None
    assert api_key_for("0.0.0.0", False, {"LOCALSPEC_API_KEY": "x"}) == "x"


def test_metrics_add_up_to_the_answers_stats(client, tiny_pair):
    from prometheus_client.parser import text_string_to_metric_families

    from localspec.models.registry import load_registry
    from localspec.server.metrics import observer_for
    from localspec.ui.manager import ModelManager, default_session_factory

    usages = [
        client.post("/v1/chat/completions", json=body(temperature=t, seed=s, localspec={"provenance": True})).json()[
            "usage"
        ]
        for t, s in ((0, 0), (1.0, 1), (0.7, 2))
    ]
    # a chat-window answer counts in the same recorder
    manager = ModelManager(
        load_registry(tiny_pair["models_yaml"]),
        default_session_factory("cpu"),
        client.admission,
        observer_for(client.metrics),
    )
    # a response is complete once its last token is sent; its worker leaves the queue a moment later
    wait_until(lambda: not client.admission.running, 30, every_s=0.01, fail=False)
    manager.load(None)
    out = manager.answer(CHAT, SamplingParams(max_new_tokens=10), lambda s: s.default_spec(), threading.Event())
    last = None
    while (msg := out.get(timeout=30)).kind != "done":
        last = msg.event if msg.kind == "event" else last
    chat = last.stats
    r = client.get("/metrics")
    assert r.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            key = (s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "model_name")))
            samples[key] = samples.get(key, 0) + s.value

    def value(name, **labels):
        return samples.get(("localspec:" + name, tuple(sorted(labels.items()))), 0)

    drafted = sum(u["drafted_tokens"] for u in usages) + chat.drafted
    accepted = sum(u["accepted_tokens"] for u in usages) + chat.accepted
    assert value("spec_decode_num_draft_tokens_total") == drafted
    assert value("spec_decode_num_accepted_tokens_total") == accepted
    assert sum(v for (n, _), v in samples.items() if n.endswith("num_accepted_tokens_per_pos_total")) == accepted
    assert value("generation_tokens_total") == sum(u["completion_tokens"] for u in usages) + chat.emitted
    assert value("prompt_tokens_total") >= sum(u["prompt_tokens"] for u in usages)
    api_requests = sum(
        v
        for (n, labels), v in samples.items()
        if n == "localspec:request_success_total" and ("source", "api") in labels
    )
    chat_requests = sum(
        v
        for (n, labels), v in samples.items()
        if n == "localspec:request_success_total" and ("source", "chat") in labels
    )
    assert (api_requests, chat_requests) == (3, 1)
    assert (
        value("spec_decode_step_seconds_count", phase="score")
        == value("spec_decode_step_seconds_count", phase="propose")
        > 0
    )
    assert value("num_requests_running") == 0 and value("num_requests_waiting") == 0
    assert value("spec_decode_adaptive_k") > 0


# ---- a real server (slow) ---------------------------------------------------------------------------------------
@pytest.fixture()
def live_server(tiny_session):
    import uvicorn

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    admission = Admission(4)
    metrics = MetricsRecorder(admission)
    server = uvicorn.Server(
        uvicorn.Config(make_app(tiny_session, admission, metrics), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, 20, fail=False)
    yield f"http://127.0.0.1:{port}", admission, metrics
    server.should_exit = True
    thread.join(10)


@pytest.mark.slow
def test_openai_client_stream_non_stream_and_cancel(live_server, tiny_session, monkeypatch):
    import openai

    url, admission, metrics = live_server
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused")
    assert [m.id for m in client.models.list()] == ["tiny"]
    whole = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=12, temperature=0)
    text = whole.choices[0].message.content
    assert whole.usage.completion_tokens > 0 and text
    stream = client.chat.completions.create(
        model="tiny",
        messages=CHAT,
        max_tokens=12,
        temperature=0,
        stream=True,
        extra_body={"localspec": {"provenance": True}},
    )
    pieces, kinds = [], []
    for chunk in stream:
        if chunk.choices:
            pieces.append(chunk.choices[0].delta.content or "")
            kinds += [t["kind"] for t in chunk.choices[0].model_extra["localspec"]["tokens"]]
    assert "".join(pieces) == text and set(kinds) <= set(TOKEN_KINDS) and kinds
    # a stream closed by the client after two chunks: the engine stops and the queue frees. The answer cannot end by
    # itself (no stop tokens; sampled, the random model would end it with one now and then), so only the close ends it
    monkeypatch.setattr(tiny_session.engine, "stop_token_ids", frozenset())
    long = client.chat.completions.create(
        model="tiny",
        messages=CHAT,
        max_tokens=900,
        temperature=1.0,
        stream=True,
        extra_body={"localspec": {"proposer": "none"}},
    )
    for i, _chunk in enumerate(long):
        if i == 2:
            break
    long.close()
    wait_until(lambda: not admission.running, 20, fail=False)
    assert admission.running == 0
    exposed = metrics.exposition().decode()
    assert 'finished_reason="cancelled"' in exposed
    generated = [line for line in exposed.splitlines() if line.startswith("localspec:generation_tokens_total")]
    assert float(generated[0].split()[-1]) < 12 * 2 + 900  # the cancelled answer did not run to its end


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl_sse_framing(live_server):
    url = live_server[0]
    out = subprocess.run(
        [
            "curl",
            "-sN",
            url + "/v1/chat/completions",
            "-H",
            "Content-Type: application/json",
            "-d",
            json.dumps(body(stream=True)),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert out.endswith("data: [DONE]\n\n")
    events = out.split("\n\n")[:-1]
    assert len(events) >= 3 and all(e.startswith("data: ") and "\n" not in e for e in events)
    assert json.loads(events[0][6:])["choices"][0]["delta"]["role"] == "assistant"
    bad = subprocess.run(
        ["curl", "-s", "-w", "\n%{http_code}", url + "/v1/chat/completions", "-H", "Content-Type: application/json"]
        + ["-d", "{not json"],
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout
    assert bad.rsplit("\n", 1)[1] == "400" and "error" in json.loads(bad.rsplit("\n", 1)[0])
