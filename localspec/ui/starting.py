"""The page the app's port serves while the window itself is built (importing Gradio and torch takes seconds).

`python app.py` binds its port first and answers every request with a small page that says it is starting; the page
asks again each second and loads the window once the window answers instead (it then shows the model's loading
stages, loadbar.py). The page holds nothing of the user's: no conversation, no setting, no model detail.
"""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Optional

FIRST_PORT, PORTS_TRIED = 7860, 100  # Gradio's own default: the first free port from 7860
MARK = "ls-starting"  # in this page only: the page reloads once the port serves something else
PAGE = f"""<!doctype html><html lang="en"><head><meta charset="utf-8"><title>localspec: starting</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>body {{ font: 16px system-ui, sans-serif; margin: 3em auto; max-width: 36em; padding: 0 1em; }}
progress {{ width: 100%; }}</style></head>
<body id="{MARK}"><h1>localspec is starting</h1><p role="status">Loading the chat window; the model loads next, and
this page shows its stages.</p><progress aria-label="starting"></progress>
<script>
setInterval(async () => {{
  try {{
    const page = await (await fetch(location.href, {{cache: 'no-store'}})).text();
    if (!page.includes('{MARK}')) location.reload();
  }} catch (_) {{}}  // between this page and the window the port is closed for a moment
}}, 1000);
</script></body></html>
""".encode()


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        window = self.path.split("?")[0] in ("", "/")
        self.send_response(200 if window else 503)  # anything else (the API, Gradio's routes) is not there yet
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Cache-Control", "no-store")
        if not window:
            self.send_header("Retry-After", "2")
        self.send_header("Content-Length", str(len(PAGE)))
        self.end_headers()
        self.wfile.write(PAGE)

    do_HEAD = do_GET

    def log_message(self, *_args) -> None:  # quiet, as the window is
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True


class _Server6(_Server):
    address_family = socket.AF_INET6


def _server(host: str, port: int) -> _Server:
    return (_Server6 if ":" in host else _Server)((host, port), _Handler)


class StartingPage:
    """Serves the starting page on host:port (the first free one from 7860 when port is None) until close()."""

    def __init__(self, host: str, port: Optional[int]) -> None:
        candidates = [port] if port is not None else range(FIRST_PORT, FIRST_PORT + PORTS_TRIED)
        error: Optional[OSError] = None
        for candidate in candidates:
            try:
                self.server = _server(host, candidate)
                break
            except OSError as exc:  # taken: the next one (or the error, for a port asked for)
                error = exc
        else:
            raise error or OSError(f"no free port from {FIRST_PORT}")
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True, name="localspec-starting").start()

    def close(self) -> None:
        """Stop answering and free the port for the window."""
        self.server.shutdown()
        self.server.server_close()
