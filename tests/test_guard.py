"""The Host check and CORS of both servers (localspec/server/guard.py), and the API's content-type and body rules.

The API runs in-process (TestClient, whose base_url sets both the Host header and the server's port); the Gradio app
is launched in-process on a free 127.0.0.1 port with the same guard its main() installs, and is sent the requests a
DNS-rebinding page would send (Host and Origin naming evil.example with the app's port).
"""

from __future__ import annotations

import json

import httpx
import pytest

from localspec.server.admission import Admission
from localspec.server.guard import AccessPolicy, split_host

from .apphelpers import free_port

LOCAL = "http://127.0.0.1:8000"
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "Say something."}], "max_tokens": 2}


def api(session, policy: AccessPolicy | None = None, base_url: str = LOCAL):
    from fastapi.testclient import TestClient

    from localspec.server.app import create_app
    from localspec.server.runner import FixedBackend

    backend = FixedBackend([session.loaded.spec], session.loaded.spec.name, session)
    app = create_app(backend, Admission(4), None, None, policy or AccessPolicy("127.0.0.1"))
    return TestClient(app, base_url=base_url)


# ---- the policy ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "host, expected",
    [
        ("127.0.0.1:8000", True),
        ("localhost:8000", True),
        ("[::1]:8000", True),
        ("LOCALHOST:8000", True),
        ("127.0.0.1:8001", False),  # another port: not this server
        ("localhost", False),  # port 80 implied
        ("evil.example:8000", False),
        ("evil.example", False),
        ("127.0.0.1.evil.example:8000", False),
        ("", False),
        (None, False),
        ("[::1:8000", False),
    ],
)
def test_a_loopback_server_answers_only_to_loopback_names_with_its_port(host, expected):
    assert AccessPolicy("127.0.0.1").host_allowed(host, 8000) is expected


def test_allowed_names_and_non_loopback_hosts():
    policy = AccessPolicy.configured("127.0.0.1", ["box.lan"], environ={"LOCALSPEC_ALLOWED_HOSTS": "proxy:443"})
    assert policy.host_allowed("box.lan:9999", 8000) and policy.host_allowed("proxy:443", 8000)
    assert not policy.host_allowed("proxy:8000", 8000) and not policy.host_allowed("evil.example:8000", 8000)
    open_host = AccessPolicy("0.0.0.0")  # a non-loopback host without names: guarded by the key / password
    assert open_host.host_allowed("anything:1", 8000)
    named = AccessPolicy("0.0.0.0", ("box.lan",))
    assert named.host_allowed("box.lan:8000", 8000) and not named.host_allowed("evil.example:8000", 8000)
    assert split_host("[::1]:80") == ("[::1]", 80) and split_host("a:b") == ("", None)


def test_cors_origins_follow_the_rule():
    loop = AccessPolicy("127.0.0.1")
    assert loop.origin_allowed("http://localhost:3000") and loop.origin_allowed("http://127.0.0.1:8080")
    assert not loop.origin_allowed("http://evil.example:8000") and not loop.origin_allowed("null")
    assert not loop.origin_allowed("http://localhost.evil.example")
    wide = AccessPolicy("0.0.0.0")
    assert not wide.origin_allowed("http://localhost:3000")  # none by default on a non-loopback host
    configured = AccessPolicy.configured("0.0.0.0", origins=["https://chat.example/"])
    assert configured.origin_allowed("https://chat.example") and not configured.origin_allowed("https://other.example")


# ---- the API ---------------------------------------------------------------------------------------------------
def test_api_refuses_a_rebinding_request(tiny_session):
    with api(tiny_session, base_url="http://evil.example:8000") as c:
        r = c.post("/v1/chat/completions", json=CHAT, headers={"Origin": "http://evil.example:8000"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "host_not_allowed"
        assert "access-control-allow-origin" not in r.headers
        assert c.get("/v1/models").status_code == 400
    with api(tiny_session) as c:  # the same request by the server's own name is answered
        assert c.post("/v1/chat/completions", json=CHAT).status_code == 200


def test_api_refuses_a_cross_origin_simple_request(tiny_session):
    with api(tiny_session) as c:
        text_plain = c.post(
            "/v1/chat/completions",
            content=json.dumps(CHAT),
            headers={"Content-Type": "text/plain", "Origin": "http://evil.example"},
        )
        assert text_plain.status_code == 403 and text_plain.json()["error"]["code"] == "origin_not_allowed"
        assert "access-control-allow-origin" not in text_plain.headers
        # without an Origin (curl, scripts) a non-JSON body is still refused, and no generation runs
        for content_type in ("text/plain", "application/x-www-form-urlencoded", None):
            headers = {"Content-Type": content_type} if content_type else {}
            r = c.post("/v1/chat/completions", content=json.dumps(CHAT), headers=headers)
            assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type", content_type
        ok = c.post("/v1/chat/completions", content=json.dumps(CHAT), headers={"Content-Type": "application/json"})
        assert ok.status_code == 200


def test_cors_preflight_and_simple_responses(tiny_session):
    preflight = {
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,x-stainless-os",
    }
    with api(tiny_session) as c:
        r = c.options("/v1/chat/completions", headers={"Origin": "http://localhost:3000", **preflight})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://localhost:3000"
        assert "x-stainless-os" in r.headers["access-control-allow-headers"].lower()
        r = c.post("/v1/chat/completions", json=CHAT, headers={"Origin": "http://localhost:3000"})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://localhost:3000"
        foreign = c.options("/v1/chat/completions", headers={"Origin": "https://evil.example", **preflight})
        assert foreign.status_code == 403 and "access-control-allow-origin" not in foreign.headers
    configured = AccessPolicy("127.0.0.1", cors_origins=("https://chat.example",))
    with api(tiny_session, configured) as c:
        r = c.options("/v1/chat/completions", headers={"Origin": "https://chat.example", **preflight})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://chat.example"


def test_chunked_body_past_the_cap_is_refused_while_reading():
    """A body without Content-Length: reading stops at the first chunk past the cap, not at the body's end."""
    import asyncio

    from starlette.requests import Request

    from localspec.server.app import read_json
    from localspec.server.schemas import MAX_BODY_BYTES, APIError

    piece = b" " * 65536
    total_chunks = 4 * MAX_BODY_BYTES // len(piece)
    received = 0

    async def receive():
        nonlocal received
        received += 1
        return {"type": "http.request", "body": piece, "more_body": received < total_chunks}

    scope = {"type": "http", "method": "POST", "path": "/", "headers": [(b"content-type", b"application/json")]}
    with pytest.raises(APIError) as info:
        asyncio.run(read_json(Request(scope, receive)))
    assert info.value.status == 413
    assert received == MAX_BODY_BYTES // len(piece) + 1  # one chunk past the cap, then no more


def test_deeply_nested_json_gets_an_openai_400(tiny_session):
    with api(tiny_session) as c:
        r = c.post("/v1/chat/completions", content=b"[" * 100_000, headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


# ---- the Gradio app --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def guarded_app(tiny_session, tmp_path_factory):
    from localspec.server.guard import guard_lifespan
    from localspec.store.db import ConversationStore
    from localspec.ui import build_app

    from .test_reliability import two_pair_manager

    store = ConversationStore(tmp_path_factory.mktemp("guard") / "conversations.db")
    demo = build_app(two_pair_manager(tiny_session), store)
    demo.queue(default_concurrency_limit=None)
    port = free_port()
    demo.launch(
        server_name="127.0.0.1",
        server_port=port,
        prevent_thread_lock=True,
        quiet=True,
        share=False,
        app_kwargs={"lifespan": guard_lifespan(AccessPolicy("127.0.0.1"))},
    )
    yield port
    demo.close()
    store.close()


@pytest.mark.parametrize(
    "method, path", [("GET", "/config"), ("GET", "/gradio_api/info"), ("POST", "/gradio_api/call/export_json")]
)
def test_gradio_refuses_a_rebinding_request(guarded_app, method, path):
    port = guarded_app
    url = f"http://127.0.0.1:{port}{path}"
    payload = {"json": {"data": [None]}} if method == "POST" else {}
    evil = {"Host": f"evil.example:{port}", "Origin": f"http://evil.example:{port}"}
    r = httpx.request(method, url, headers=evil, timeout=30, **payload)
    assert r.status_code == 400 and r.json()["error"]["code"] == "host_not_allowed"
    assert "access-control-allow-origin" not in r.headers
    own = httpx.request(method, url, headers={"Origin": f"http://127.0.0.1:{port}"}, timeout=30, **payload)
    assert own.status_code == 200, own.text  # the app's own page gets through


def test_gradio_does_not_echo_a_foreign_origin(guarded_app):
    port = guarded_app
    r = httpx.get(f"http://127.0.0.1:{port}/config", headers={"Origin": "http://evil.example"}, timeout=30)
    assert r.status_code == 403 and "access-control-allow-origin" not in r.headers
    own = f"http://127.0.0.1:{port}"
    ok = httpx.get(f"http://127.0.0.1:{port}/config", headers={"Origin": own}, timeout=30)
    assert ok.status_code == 200 and ok.headers.get("access-control-allow-origin") in (None, own)
    assert ok.headers.get("access-control-allow-credentials") is None  # Gradio's own header was dropped


@pytest.mark.slow
def test_the_app_process_installs_the_guard(tiny_pair, tmp_path):
    """`python app.py --api` as users start it: its Gradio routes and its API refuse a rebinding request."""
    from .apphelpers import AppProcess, tiny_models_yaml

    app = AppProcess(tiny_models_yaml(tiny_pair, tmp_path), tmp_path, extra=("--api",)).wait_ready()
    try:
        evil = {"Host": f"evil.example:{app.port}", "Origin": f"http://evil.example:{app.port}"}
        for path in ("config", "v1/models", "gradio_api/info"):
            r = httpx.get(app.url + path, headers=evil, timeout=30)
            assert r.status_code == 400 and "access-control-allow-origin" not in r.headers, path
            assert httpx.get(app.url + path, timeout=30).status_code == 200, path
        plain = httpx.post(app.url + "v1/chat/completions", content=b"{}", headers={"Content-Type": "text/plain"})
        assert plain.status_code == 415
        unknown = httpx.get(app.url + "v1/nothing", timeout=30)  # ahead of Gradio's own 404
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "not_found"
    finally:
        app.stop()
