"""One API request's generation: waits its turn in the shared FIFO queue, then runs the engine in a worker thread
and hands events to the request's asyncio task. Cancelling (client gone, stop string) stops the engine."""

from __future__ import annotations

import asyncio
import threading
from typing import Protocol

from localspec.config import ConfigError, PairSpec

from .admission import Admission
from .metrics import MetricsRecorder
from .schemas import APIError, GenerationRequest

POLL_S = 0.1  # how often a waiting request looks at its cancel flag


class Backend(Protocol):
    """Where the loaded pair comes from: a fixed session (`localspec serve`) or the chat app's manager."""

    pairs: list[PairSpec]

    def current(self) -> tuple[str | None, object]:
        """(pair name, ChatSession) of the loaded pair; (None, None) when none is loaded."""
        ...


class FixedBackend:
    def __init__(self, pairs: list[PairSpec], name: str, session) -> None:
        self.pairs, self.name, self.session = pairs, name, session

    def current(self) -> tuple[str | None, object]:
        return self.name, self.session


class ManagerBackend:
    """The chat app's ModelManager (duck-typed: .pairs, .name, .session), so the API answers with its pair."""

    def __init__(self, manager) -> None:
        self.manager = manager
        self.pairs = manager.pairs

    def current(self) -> tuple[str | None, object]:
        return self.manager.name, self.manager.session


def check_model(backend: Backend, model: str) -> None:
    name, session = backend.current()
    if session is None:
        raise APIError("no model pair is loaded", "model", 503, "server_error", "model_not_loaded")
    if model != name:
        known = [p.name for p in backend.pairs]
        message = (
            f"model {model!r} is listed but not loaded; this server answers with {name!r}"
            if model in known
            else f"model {model!r} does not exist; this server answers with {name!r}"
        )
        raise APIError(message, "model", 404, code="model_not_found")


class Job:
    """Items on .items: ('event', StepEvent) …, then ('error', APIError) or nothing, then ('end', None)."""

    def __init__(
        self, request: GenerationRequest, backend: Backend, admission: Admission, metrics: MetricsRecorder | None
    ) -> None:
        self.request, self.backend, self.admission, self.metrics = request, backend, admission, metrics
        self.cancel = threading.Event()
        self.prompt_tokens = 0
        self.tokenizer = None
        self.ticket = admission.enter("api")  # QueueFull when the queue is full: nothing started
        self.items: asyncio.Queue[tuple[str, object]] = asyncio.Queue()
        self._loop = asyncio.get_running_loop()
        admission.workers.start(self._run, self.cancel, "localspec-api-answer")

    def _push(self, kind: str, item: object = None) -> None:
        try:
            self._loop.call_soon_threadsafe(self.items.put_nowait, (kind, item))
        except RuntimeError:  # the event loop is gone (server shutting down)
            self.cancel.set()

    def _run(self) -> None:
        try:
            while not self.admission.wait(self.ticket, POLL_S):
                if self.cancel.is_set():
                    return
            if self.cancel.is_set():
                return
            self._generate()
        except APIError as exc:
            self._push("error", exc)
        except ConfigError as exc:
            self._push("error", APIError(str(exc), "messages" if self.request.endpoint == "chat" else "prompt"))
        except Exception as exc:  # the server stays up; the client is told what went wrong
            self._push("error", APIError(f"generation failed: {type(exc).__name__}: {exc}", None, 500, "server_error"))
        finally:
            self.admission.leave(self.ticket)
            self._push("end")

    def _generate(self) -> None:
        request = self.request
        check_model(self.backend, request.model)
        name, session = self.backend.current()
        self.tokenizer = session.tokenizer
        spec = request.spec_for(session)
        if request.endpoint == "chat":
            ids, _notice = session.prompt_ids(list(request.messages), request.sampling.max_new_tokens)
        else:
            ids = list(session.tokenizer.encode(request.prompt))
        self.prompt_tokens = len(ids)
        for event in session.stream_ids(ids, request.sampling, spec, self.cancel):
            if self.metrics is not None:
                self.metrics.observe(event, model=name, source="api", prompt_tokens=len(ids))
            if event.finish_reason == "error":
                raise APIError(event.error or "generation failed", None, 500, "server_error")
            self._push("event", event)
