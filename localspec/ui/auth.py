"""The password check for a non-loopback --host, throttled per client address.

Gradio 6 calls `auth(username, password)` with no request, so a small ASGI middleware (installed through
launch(app_kwargs={"middleware": ...})) puts each request's client address in a context variable that the check
reads. After FREE_FAILURES wrong passwords from one address, each further attempt from it waits
BASE_DELAY_S · 2^(failures − FREE_FAILURES), at most MAX_DELAY_S, and one address's attempts are answered one at a time,
so guessing runs at a few tries a minute. A right password clears that address's record.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass

FREE_FAILURES = 3
BASE_DELAY_S = 0.5
MAX_DELAY_S = 30.0
CLIENT: ContextVar[str] = ContextVar("localspec_client", default="unknown")


class ClientAddress:
    """ASGI middleware: CLIENT holds the address of the request being served."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope.get("type") in ("http", "websocket"):
            client = scope.get("client")
            token = CLIENT.set(str(client[0]) if client else "unknown")
            try:
                return await self.app(scope, receive, send)
            finally:
                CLIENT.reset(token)
        return await self.app(scope, receive, send)


@dataclass
class _Record:
    failures: int = 0
    lock: asyncio.Lock | None = None


class ThrottledPassword:
    """`check(username, password) -> bool`, slowed down per client after failures. Gradio gets `attempt`: it must
    be a coroutine function (Gradio awaits only those; anything else it calls and treats as a plain answer)."""

    def __init__(
        self, check: Callable[[str, str], bool], sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    ) -> None:
        self.check = check
        self.sleep = sleep
        self.records: dict[str, _Record] = {}

    @staticmethod
    def delay_for(failures: int) -> float:
        """Seconds an attempt waits after `failures` wrong passwords in a row from its address."""
        extra = failures - FREE_FAILURES  # 0 for the first attempt after the free ones
        return 0.0 if extra < 0 else min(BASE_DELAY_S * 2**extra, MAX_DELAY_S)

    async def attempt(self, username: str, password: str) -> bool:
        client = CLIENT.get()
        record = self.records.setdefault(client, _Record())
        if record.lock is None:
            record.lock = asyncio.Lock()
        async with record.lock:  # one address: one attempt at a time
            delay = self.delay_for(record.failures)
            if delay:
                await self.sleep(delay)
            ok = bool(self.check(username, password))
            if ok:
                self.records.pop(client, None)
            else:
                record.failures += 1
            return ok


def launch_kwargs(check: Callable[[str, str], bool] | None) -> dict:
    """Keyword arguments for Blocks.launch(): the throttled check and the middleware it needs (none without auth)."""
    if check is None:
        return {"auth": None}
    from starlette.middleware import Middleware

    return {"auth": ThrottledPassword(check).attempt, "app_kwargs": {"middleware": [Middleware(ClientAddress)]}}
