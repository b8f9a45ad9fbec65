"""Who may reach a server by name and from which web page: the Host check and CORS of both servers.

The API (`localspec serve`) and the chat app (`python app.py`, with or without --api) answer only requests whose
`Host` names this server: while bound to loopback, a loopback name or address with the server's own port, plus the
names the user allows (--allowed-host / LOCALSPEC_ALLOWED_HOSTS). That stops DNS rebinding: a page on
evil.example that re-resolves its name to 127.0.0.1 still sends `Host: evil.example:PORT` and is refused. On a
non-loopback --host without allowed names every Host is accepted (the password / API key guards that server).

Cross-origin requests follow one rule (Starlette's CORSMiddleware): the origins the user allows (--cors-origin /
LOCALSPEC_CORS_ORIGINS), plus loopback origins for a loopback server, none by default on another host; on the chat
app's server the rule covers the API's routes only (API_PATHS), and Gradio's own routes (the conversations, their
export and deletion) answer the app's own origin alone, so a page on another loopback port reads nothing. A request
that carries an `Origin` outside that rule and is not same-origin is refused before it runs, so a page cannot spend
the engine with a "simple" request that a browser sends without a preflight. Inner CORS headers (Gradio's own
middleware echoes a foreign origin when the Host is not a loopback name) are dropped, so only this rule answers.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from urllib.parse import urlsplit

from starlette.middleware.cors import CORSMiddleware

from localspec.config import Environment

from .auth import is_loopback

ALLOWED_HOSTS_ENV = "LOCALSPEC_ALLOWED_HOSTS"
CORS_ORIGINS_ENV = "LOCALSPEC_CORS_ORIGINS"
LOOPBACK_ORIGIN = r"https?://(localhost|127(\.\d{1,3}){3}|\[::1\])(:\d{1,5})?"
API_PATHS = ("/v1/", "/v1", "/health", "/metrics")  # the API's routes (server/app.py): '/v1/' a prefix, others exact


def split_host(value: str) -> tuple[str, int | None]:
    """'name:port' / '[::1]:port' / 'name' → (lower-case name, port or None); ('', None) when malformed."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return "", None
        name, rest = value[: end + 1], value[end + 1 :]
        if not rest:
            return name, None
        if not rest.startswith(":") or not rest[1:].isdigit():
            return "", None
        return name, int(rest[1:])
    name, sep, port = value.rpartition(":")
    if not sep:
        return value, None
    if not port.isdigit() or not name or ":" in name:
        return "", None
    return name, int(port)


@dataclass(frozen=True)
class AccessPolicy:
    """The Host names and CORS origins a server bound to `bind_host` accepts (see the module docstring)."""

    bind_host: str
    allowed_hosts: tuple[str, ...] = ()  # 'name' (any port) or 'name:port'
    cors_origins: tuple[str, ...] = ()  # 'scheme://name[:port]', or '*'
    cross_origin_paths: tuple[str, ...] | None = None  # the paths other origins may call (API_PATHS); None: every one

    @classmethod
    def configured(
        cls, bind_host: str, hosts: Iterable[str] = (), origins: Iterable[str] = (), environ=None
    ) -> AccessPolicy:
        """The flags' names plus the environment's (LOCALSPEC_ALLOWED_HOSTS, LOCALSPEC_CORS_ORIGINS)."""
        env = Environment.read(environ)
        return cls(
            bind_host,
            tuple(hosts) + env.allowed_hosts,
            tuple(o.rstrip("/") for o in tuple(origins) + env.cors_origins),
        )

    @property
    def loopback(self) -> bool:
        return is_loopback(self.bind_host)

    def host_allowed(self, host: str | None, port: int | None) -> bool:
        """Whether a request with this Host header reached the server listening on `port` by one of its names."""
        if not self.loopback and not self.allowed_hosts:
            return True
        name, given = split_host(host or "")
        if not name:
            return False
        for entry in self.allowed_hosts:
            allowed_name, allowed_port = split_host(entry)
            if allowed_name == name and allowed_port in (None, given):
                return True
        if given is None:
            given = 80
        own = {self.bind_host.lower()} if not self.loopback else set()
        return (is_loopback(name) or name in own) and (port is None or given == port)

    def origin_regex(self) -> str | None:
        return LOOPBACK_ORIGIN if self.loopback else None

    def for_chat_app(self) -> AccessPolicy:
        """The policy of the chat app's server: other origins reach the API's routes only, never Gradio's."""
        return replace(self, cross_origin_paths=API_PATHS)

    def crosses(self, path: str) -> bool:
        """Whether a page of another origin may call `path` at all (the rule below then says which origins)."""
        if self.cross_origin_paths is None:
            return True
        return any(path == p or (p.endswith("/") and path.startswith(p)) for p in self.cross_origin_paths)

    def origin_allowed(self, origin: str, path: str | None = None) -> bool:
        """Whether a page at `origin` may call this server (at `path`, when given)."""
        if path is not None and not self.crosses(path):
            return False
        origin = origin.rstrip("/")
        if "*" in self.cors_origins or origin in self.cors_origins:
            return True
        regex = self.origin_regex()
        return regex is not None and re.fullmatch(regex, origin) is not None


def same_origin(origin: str, host: str | None, scheme: str) -> bool:
    """Whether Origin names the very host:port the request was sent to (the page is the server's own)."""
    parts = urlsplit(origin)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return False
    origin_name, origin_port = split_host(parts.netloc)
    host_name, host_port = split_host(host or "")
    default = {"http": 80, "https": 443, "ws": 80, "wss": 443}
    return bool(host_name) and (origin_name, origin_port or default[parts.scheme]) == (
        host_name,
        host_port or default.get(scheme, 80),
    )


def refusal(message: str, code: str) -> bytes:
    body = {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}
    return json.dumps(body).encode()


class _DropInnerCORS:
    """ASGI: removes Access-Control-* headers an inner app set, so that only the outer CORSMiddleware answers."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def sending(message):
            if message["type"] == "http.response.start":
                message["headers"] = [
                    (k, v) for k, v in message.get("headers", []) if not k.lower().startswith(b"access-control-")
                ]
            await send(message)

        return await self.app(scope, receive, sending)


class HostGuard:
    """ASGI: refuses a request whose Host or Origin the policy does not accept, then applies its CORS rule."""

    def __init__(self, app, policy: AccessPolicy) -> None:
        self.policy = policy
        self.app = CORSMiddleware(
            _DropInnerCORS(app),
            allow_origins=[o for o in policy.cors_origins if o != "*"] or (["*"] if "*" in policy.cors_origins else []),
            allow_origin_regex=policy.origin_regex(),
            allow_methods=["GET", "POST", "OPTIONS"],
            allow_headers=["*"],
            max_age=600,
        )

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        host = headers.get("host")
        server = scope.get("server")
        port = server[1] if server and len(server) > 1 else None
        if not self.policy.host_allowed(host, port):
            return await self._refuse(
                scope,
                send,
                400 if scope["type"] == "http" else 1008,
                f"this server does not answer to Host {host!r}: it is bound to {self.policy.bind_host}; allow another "
                f"name with --allowed-host or {ALLOWED_HOSTS_ENV}",
                "host_not_allowed",
            )
        origin = headers.get("origin")
        scheme = scope.get("scheme", "http")
        path = scope.get("path", "")
        if (
            origin is not None
            and not self.policy.origin_allowed(origin, path)
            and not same_origin(origin, host, scheme)
        ):
            return await self._refuse(
                scope,
                send,
                403 if scope["type"] == "http" else 1008,
                f"requests from the web page at {origin[:200]!r} are not allowed; allow it with --cors-origin or "
                f"{CORS_ORIGINS_ENV}",
                "origin_not_allowed",
            )
        return await self.app(scope, receive, send)

    @staticmethod
    async def _refuse(scope, send, status: int, message: str, code: str) -> None:
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": status})
            return
        body = refusal(message, code)
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})


def add_access_options(parser) -> None:
    """--allowed-host and --cors-origin, the same for `localspec serve` and `python app.py`."""
    parser.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME[:PORT]",
        help=f"another name clients may reach this server by (a DNS name of a non-loopback --host, a proxy's "
        f"name); repeatable; also {ALLOWED_HOSTS_ENV}=a,b",
    )
    parser.add_argument(
        "--cors-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help=f"a web page origin (scheme://name[:port]) whose scripts may call the API (/v1, /health, /metrics); "
        f"repeatable; also {CORS_ORIGINS_ENV}=a,b (loopback origins are allowed for a loopback server; the chat "
        "window's own routes answer only its own page)",
    )


def policy_for(args) -> AccessPolicy:
    return AccessPolicy.configured(args.host, args.allowed_host, args.cors_origin)


def guard_lifespan(policy: AccessPolicy):
    """A lifespan for Gradio's launch(app_kwargs={'lifespan': …}): wraps the app's whole middleware stack, with
    cross-origin calls allowed on the API's routes only (AccessPolicy.for_chat_app).

    Gradio adds its own CORS middleware outside the app's `middleware` list, so the guard goes around the built
    stack instead (Starlette builds it before the lifespan runs; the stack serves every later request).
    """
    import contextlib

    @contextlib.asynccontextmanager
    async def lifespan(app):
        if not isinstance(app.middleware_stack, HostGuard):
            app.middleware_stack = HostGuard(app.middleware_stack, policy.for_chat_app())
        yield

    return lifespan
