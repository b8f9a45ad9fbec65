"""First come, first served admission to the one engine, shared by the chat window and the API.

The engine answers one request at a time. Each caller takes a Ticket (enter), builds its prompt, then waits for the
engine (wait); tickets are served in the order they were taken among those whose prompt is ready, whoever took them,
so a prompt still being built (a model's chat template, a long conversation's truncation) never holds up the ones
behind it. At most `max_waiting` may wait or prepare at once (one more is refused with QueueFull, which the
API turns into 429 + Retry-After and the chat window into a message). Loading a model pair uses the Lock-like
acquire/release: a non-blocking acquire succeeds only when nobody holds or waits, so it never jumps the queue.
"""

from __future__ import annotations

import threading
import time
from collections import deque

from localspec.config import ConfigError
from localspec.runtime.memory import release_free_memory

DEFAULT_MAX_WAITING = 8
RETRY_AFTER_S = 2  # what a refused caller is told to wait before asking again
STOP_TIMEOUT_S = 20.0  # how long an ending process waits for its answers to stop (each stops within one step)


class QueueFull(ConfigError):
    """Too many requests are waiting for the engine; nothing was started."""

    def __init__(self, waiting: int, retry_after_s: int = RETRY_AFTER_S) -> None:
        super().__init__(f"the model is busy: {waiting} requests are already waiting; try again in a moment")
        self.retry_after_s = retry_after_s


class Ticket:
    """A place in the queue. `source` says who took it (chat / api / load), for the metrics and messages."""

    def __init__(self, source: str, ready: bool = False) -> None:
        self.source = source
        self.created = time.perf_counter()
        self.ready = ready  # its prompt is built: it waits for the engine (set by Admission.wait)


class Workers:
    """The threads that run answers (chat window and API), each with its cancel flag, so that a process that is
    ending (SIGTERM) can stop them and wait for them: a native thread still inside the engine at interpreter exit
    aborts the process ("terminate called without an active exception")."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[threading.Thread, threading.Event] = {}

    def start(self, target, cancel: threading.Event, name: str) -> threading.Thread:
        def run() -> None:
            try:
                target()
            finally:
                with self._lock:
                    self._running.pop(threading.current_thread(), None)

        thread = threading.Thread(target=run, daemon=True, name=name)
        with self._lock:
            self._running[thread] = cancel
        thread.start()
        return thread

    @property
    def count(self) -> int:
        return len(self._running)

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> bool:
        """Cancel every answer and wait for its thread (True when all ended within timeout_s)."""
        with self._lock:
            running = list(self._running.items())
        for _thread, cancel in running:
            cancel.set()
        deadline = time.monotonic() + timeout_s
        for thread, _cancel in running:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread, _ in running)


class Admission:
    def __init__(self, max_waiting: int = DEFAULT_MAX_WAITING) -> None:
        if isinstance(max_waiting, bool) or not isinstance(max_waiting, int) or max_waiting < 0:
            raise ConfigError(f"the queue size must be a whole number ≥ 0 (got {max_waiting!r})")
        self.max_waiting = max_waiting
        self._cond = threading.Condition()
        self._queue: deque[Ticket] = deque()
        self._holder: Ticket | None = None
        self.workers = Workers()  # the answer threads of everyone who queues here

    @property
    def waiting(self) -> int:
        return len(self._queue)

    @property
    def running(self) -> int:
        return 0 if self._holder is None else 1

    # ---- tickets ----------------------------------------------------------------------------------------------
    def enter(self, source: str = "api") -> Ticket:
        """Take a place at the end of the queue, or raise QueueFull."""
        ticket = Ticket(source)
        with self._cond:
            if len(self._queue) >= self.max_waiting and not (self._holder is None and not self._queue):
                raise QueueFull(len(self._queue))
            self._queue.append(ticket)
            self._cond.notify_all()
        return ticket

    def _first_ready(self) -> Ticket | None:
        return next((t for t in self._queue if t.ready), None)

    def wait(self, ticket: Ticket, timeout: float | None = None) -> bool:
        """Mark the ticket ready and block until it is the first ready one with the engine free, then take the engine
        (True); or until timeout (False, place kept)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            if self._holder is ticket:
                return True
            if not ticket.ready:
                ticket.ready = True
                self._cond.notify_all()
            while not (self._holder is None and self._first_ready() is ticket):
                if ticket not in self._queue:
                    raise ValueError("this ticket has left the queue")
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._cond.wait(remaining)
            self._queue.remove(ticket)
            self._holder = ticket
            return True

    def step_back(self, ticket: Ticket) -> None:
        """Give the engine back and stand first in line again, not ready: the holder found its prompt out of date (a
        pair loaded while it waited) and builds it again without holding the engine."""
        with self._cond:
            if self._holder is not ticket:
                raise ValueError("step_back by a ticket that does not hold the engine")
            self._holder = None
            ticket.ready = False
            self._queue.appendleft(ticket)
            self._cond.notify_all()

    def leave(self, ticket: Ticket) -> None:
        """Give the engine back (when held) or the place up (when waiting). Safe to call twice. The last answer
        before an idle engine hands its freed memory back to the OS (runtime/memory.py)."""
        with self._cond:
            held = self._holder is ticket
            if held:
                self._holder = None
            else:
                try:
                    self._queue.remove(ticket)
                except ValueError:
                    pass
            idle = held and not self._queue
            self._cond.notify_all()
        if idle:
            release_free_memory()

    # ---- Lock-compatible use (model loading) --------------------------------------------------------------------
    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        with self._cond:
            if not blocking:
                if self._holder is None and not self._queue:
                    self._holder = Ticket("load")
                    return True
                return False
            ticket = Ticket("load", ready=True)
            self._queue.append(ticket)  # a blocking acquire waits its turn without counting against the bound
        if self.wait(ticket, None if timeout < 0 else timeout):
            return True
        self.leave(ticket)
        return False

    def release(self) -> None:
        with self._cond:
            if self._holder is None:
                raise RuntimeError("release of an Admission nobody holds")
            self._holder = None
            idle = not self._queue
            self._cond.notify_all()
        if idle:  # a load that replaced a pair freed the old one's blocks
            release_free_memory()

    def __enter__(self) -> Admission:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
