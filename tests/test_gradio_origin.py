"""On the chat app's server (`python app.py --api`), a page on another loopback port may call the API (/v1, its
CORS) but none of Gradio's own routes: the conversations, their export and deletion answer the app's own page
alone. Before, the loopback-origin rule meant for API clients covered every route: any local page read them all."""

from __future__ import annotations

import socket

import httpx
import pytest

from localspec.server.guard import AccessPolicy

OTHER_PAGE = "http://localhost:3000"  # a local dev server, or any package's page on localhost


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def app_with_api(tiny_session, tmp_path_factory):
    from localspec.server.app import build_routes
    from localspec.server.guard import guard_lifespan
    from localspec.server.runner import ManagerBackend
    from localspec.store.db import ConversationStore
    from localspec.ui import build_app

    from .test_reliability import two_pair_manager

    store = ConversationStore(tmp_path_factory.mktemp("origin") / "conversations.db")
    manager = two_pair_manager(tiny_session)
    demo = build_app(manager, store)
    demo.queue(default_concurrency_limit=None)
    port = free_port()
    routes = build_routes(ManagerBackend(manager), manager._lock, None, None)
    demo.launch(
        server_name="127.0.0.1",
        server_port=port,
        prevent_thread_lock=True,
        quiet=True,
        share=False,
        app_kwargs={"lifespan": guard_lifespan(AccessPolicy("127.0.0.1")), "routes": routes},
    )
    yield f"http://127.0.0.1:{port}"
    demo.close()
    store.close()


@pytest.mark.parametrize(
    "method, path",
    [
        ("POST", "/gradio_api/call/list_conversations"),
        ("POST", "/gradio_api/call/export_json"),
        ("GET", "/config"),
        ("GET", "/gradio_api/info"),
        ("OPTIONS", "/gradio_api/call/list_conversations"),
    ],
)
def test_another_loopback_page_reaches_no_gradio_route(app_with_api, method, path):
    headers = {"Origin": OTHER_PAGE}
    if method == "OPTIONS":  # the browser's preflight
        headers.update({"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"})
    payload = {"json": {"data": [None]}} if method == "POST" else {}
    r = httpx.request(method, app_with_api + path, headers=headers, timeout=30, **payload)
    assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed", r.text[:300]
    assert "access-control-allow-origin" not in r.headers
    if method != "OPTIONS":  # the app's own page still gets through
        own = httpx.request(method, app_with_api + path, headers={"Origin": app_with_api}, timeout=30, **payload)
        assert own.status_code == 200, own.text[:300]


@pytest.mark.parametrize(
    "method, path", [("GET", "/v1/models"), ("GET", "/health"), ("OPTIONS", "/v1/chat/completions")]
)
def test_another_loopback_page_keeps_the_api(app_with_api, method, path):
    headers = {"Origin": OTHER_PAGE}
    if method == "OPTIONS":
        headers.update({"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"})
    r = httpx.request(method, app_with_api + path, headers=headers, timeout=30)
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == OTHER_PAGE, r.text[:300]


def test_the_rule_names_the_api_paths_only():
    chat_app = AccessPolicy("127.0.0.1", cors_origins=("https://chat.example",)).for_chat_app()
    for path in ("/v1/chat/completions", "/v1/models", "/health", "/metrics"):
        assert chat_app.origin_allowed(OTHER_PAGE, path) and chat_app.origin_allowed("https://chat.example", path)
    for path in ("/gradio_api/call/list_conversations", "/config", "/", "/v1x", "/healthz", "/file=x"):
        assert not chat_app.origin_allowed(OTHER_PAGE, path) and not chat_app.origin_allowed(
            "https://chat.example", path
        )
    api_only = AccessPolicy("127.0.0.1")  # `localspec serve`: every route is the API
    assert api_only.origin_allowed(OTHER_PAGE, "/anything")
