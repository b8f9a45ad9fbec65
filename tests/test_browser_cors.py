"""CORS and DNS rebinding in a real browser (Playwright, Debian's Chromium): a page on another loopback origin calls
the API with a preflighted request and gets its answer; a page on a foreign origin is refused at the preflight and
runs nothing; a rebinding page (a foreign name resolving to 127.0.0.1, same port) is refused by the Host check.

Chromium's --host-resolver-rules maps evil.example to 127.0.0.1, as a rebinding DNS server would.
"""

from __future__ import annotations

import http.server
import socket
import threading
import time

import pytest

from .test_browser import CHROMIUM, CHROMIUM_ARGS
from .test_server import make_app

pytestmark = [pytest.mark.browser, pytest.mark.slow]
CALL = """async ([url, headers]) => {
  try {
    const r = await fetch(url, {method: "POST", headers: headers, body: JSON.stringify(
      {model: "tiny", messages: [{role: "user", content: "Say something."}], max_tokens: 4, temperature: 0})});
    return {status: r.status, body: await r.text()};
  } catch (e) { return {error: String(e)}; }
}"""
HEADERS = {"Content-Type": "application/json", "Authorization": "Bearer unused"}  # both need a preflight


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def servers(tiny_session):
    import uvicorn

    from localspec.server.admission import Admission
    from localspec.server.metrics import MetricsRecorder

    admission = Admission(4)
    metrics = MetricsRecorder(admission)
    api_port, page_port = free_port(), free_port()
    server = uvicorn.Server(
        uvicorn.Config(make_app(tiny_session, admission, metrics), host="127.0.0.1", port=api_port, log_level="warning")
    )
    threading.Thread(target=server.run, daemon=True).start()

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # an empty page: the test's script runs in its origin
            body = b"<!doctype html><title>page</title>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    pages = http.server.ThreadingHTTPServer(("127.0.0.1", page_port), Page)
    threading.Thread(target=pages.serve_forever, daemon=True).start()
    deadline = time.time() + 20
    while not server.started and time.time() < deadline:
        time.sleep(0.05)
    yield api_port, page_port, metrics
    pages.shutdown()
    server.should_exit = True


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api")
    if not __import__("pathlib").Path(CHROMIUM).exists():
        pytest.skip("needs Debian's chromium at /usr/bin/chromium")
    with sync_api.sync_playwright() as playwright:
        args = [*CHROMIUM_ARGS, "--host-resolver-rules=MAP evil.example 127.0.0.1"]
        instance = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=args)
        yield instance
        instance.close()


def call_from(browser, page_url: str, api_url: str) -> dict:
    page = browser.new_page()
    try:
        page.goto(page_url, wait_until="load")
        return page.evaluate(CALL, [api_url, HEADERS])
    finally:
        page.close()


def answered(metrics) -> float:
    text = metrics.exposition().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith("localspec:request_success"))


def test_a_loopback_page_passes_the_preflight(browser, servers):
    api_port, page_port, metrics = servers
    result = call_from(browser, f"http://localhost:{page_port}/", f"http://127.0.0.1:{api_port}/v1/chat/completions")
    assert result.get("status") == 200, result
    assert '"chat.completion"' in result["body"]


def test_a_foreign_page_is_refused_at_the_preflight(browser, servers):
    api_port, page_port, metrics = servers
    before = answered(metrics)
    result = call_from(browser, f"http://evil.example:{page_port}/", f"http://127.0.0.1:{api_port}/v1/chat/completions")
    assert "error" in result and "Failed to fetch" in result["error"], result
    assert answered(metrics) == before  # nothing ran


def test_a_rebinding_page_is_refused_by_the_host_check(browser, servers):
    api_port, _page_port, metrics = servers
    before = answered(metrics)
    same_port = f"http://evil.example:{api_port}"  # the page's own origin: no CORS involved, only Host
    page = browser.new_page()
    try:
        page.goto(same_port + "/v1/models", wait_until="load")
        result = page.evaluate(CALL, [same_port + "/v1/chat/completions", {"Content-Type": "application/json"}])
    finally:
        page.close()
    assert result.get("status") == 400 and "host_not_allowed" in result["body"], result
    assert answered(metrics) == before
