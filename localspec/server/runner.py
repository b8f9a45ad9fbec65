"""One API request's generation: waits its turn in the shared FIFO queue, then runs the engine in a worker thread
and hands events to the request's asyncio task. Cancelling (client gone, stop string) stops the engine."""

from __future__ import annotations

import asyncio
import re
import threading
from typing import Optional, Protocol

from localspec.chat import PromptTooLong
from localspec.config import ConfigError, PairSpec
from localspec.engine.events import steps
from localspec.models.fim import fim_prompt_ids
from localspec.structured.tools import generic_messages, native_messages, template_uses_tools

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


def slug(name: str) -> str:
    """A pair's model id: its name in lower case with every run of other characters turned into one '-'
    ('SmolLM2-135M-Instruct (embedded)' → 'smollm2-135m-instruct-embedded'). The name is its display name."""
    return re.sub(r"[^a-z0-9.]+", "-", name.lower()).strip("-") or "model"


def pair_named(backend: Backend, model: str) -> str | None:
    """The pair name a request's model field stands for (its id or its display name); None when neither."""
    for pair in backend.pairs:
        if model in (pair.name, slug(pair.name)):
            return pair.name
    return None


def check_model(backend: Backend, model: str) -> None:
    name, session = backend.current()
    if session is None:
        raise APIError("no model pair is loaded", "model", 503, "server_error", "model_not_loaded")
    asked = pair_named(backend, model)
    if asked != name:
        message = (
            f"model {model!r} is listed but not loaded; this server answers with {slug(name)!r}"
            if asked is not None
            else f"model {model!r} does not exist; this server answers with {slug(name)!r}"
        )
        raise APIError(message, "model", 404, code="model_not_found")


def template_input(request: GenerationRequest, tokenizer) -> tuple[list[dict], Optional[list[dict]]]:
    """(messages, tools) for the chat template: as sent without tools; with tools or tool messages, in the Hugging
    Face form with the tools where the model's template reads a `tools` variable, else in the generic format
    (structured/tools.py)."""
    messages = list(request.messages)
    spec = request.tools
    tool_messages = any(m["role"] == "tool" or m.get("tool_calls") for m in messages)
    if spec is None and not tool_messages:
        return messages, None
    if spec is not None and template_uses_tools(tokenizer):
        return native_messages(messages), spec.openai_tools()
    return generic_messages(messages, spec), None


def fingerprint(name: str, session) -> str:
    """system_fingerprint: the loaded model, the dtype it runs in and its weight format; changes when they do."""
    loaded = session.loaded
    dtype = loaded.dtype.dtype if loaded.dtype is not None else "auto"
    return f"localspec:{slug(name)}:{dtype}:{loaded.quant}"


class Job:
    """Items on .items: ('event', StepEvent) …, then ('error', APIError) or nothing, then ('end', None)."""

    def __init__(
        self, request: GenerationRequest, backend: Backend, admission: Admission, metrics: MetricsRecorder | None
    ) -> None:
        self.request, self.backend, self.admission, self.metrics = request, backend, admission, metrics
        self.cancel = threading.Event()
        self.prompt_tokens = 0
        self.tokenizer = None
        self.notice: str | None = None  # what truncation or merged system messages changed (chat.prompt_ids)
        self.model_name: str | None = None
        self.fingerprint: str | None = None
        self.recorded = False  # counted in the metrics (once, by the route)
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
            prompt = self._prompt()  # not ready yet: the requests behind this one go first (admission.py)
            while not self.admission.wait(self.ticket, POLL_S):
                if self.cancel.is_set():
                    return
            if self.cancel.is_set():
                return
            self._generate(*prompt)
        except APIError as exc:
            self._push("error", exc)
        except ConfigError as exc:
            self._push("error", APIError(str(exc), "messages" if self.request.endpoint == "chat" else "prompt"))
        except Exception as exc:  # the server stays up; the client is told what went wrong
            self._push("error", APIError(f"generation failed: {type(exc).__name__}: {exc}", None, 500, "server_error"))
        finally:
            self.admission.leave(self.ticket)
            self._push("end")

    def _prompt(self) -> tuple[str, object, list[int]]:
        """(pair name, session, prompt ids) of the loaded pair; the chat template and truncation run here."""
        request = self.request
        check_model(self.backend, request.model)
        name, session = self.backend.current()
        self.tokenizer = session.tokenizer
        if request.endpoint == "chat":
            messages, tools = template_input(request, session.tokenizer)
            try:
                ids, self.notice = session.prompt_ids(
                    messages,
                    request.sampling.max_new_tokens,
                    truncate=request.extension.truncate,
                    cancel=self.cancel,
                    **({"tools": tools} if tools is not None else {}),
                )
            except PromptTooLong as exc:
                raise APIError(
                    f'{exc}; shorten the conversation, lower max_tokens, or send "localspec": {{"truncate": true}} '
                    "to leave out the oldest turns",
                    "messages",
                    code="context_length_exceeded",
                ) from None
        elif request.suffix:
            try:
                ids = fim_prompt_ids(session.tokenizer, request.prompt, request.suffix)
            except ConfigError as exc:
                raise APIError(str(exc), "suffix") from None
        else:
            ids = list(session.tokenizer.encode(request.prompt))
        self.prompt_tokens = len(ids)
        self.model_name, self.fingerprint = name, fingerprint(name, session)
        return name, session, ids

    def _generate(self, name: str, session, ids: list[int]) -> None:
        request = self.request
        check_model(self.backend, request.model)  # the same pair still: a switch waits behind this request
        spec = request.spec_for(session)
        constrained = {"constraint": request.constraint} if request.constraint is not None else {}
        # the prompt's reading progress is the window's: an OpenAI client is sent no chunk it does not know
        for event in steps(session.stream_ids(ids, request.sampling, spec, self.cancel, **constrained)):
            if self.metrics is not None:  # the request itself is counted by the route, with what it answered
                self.metrics.observe_step(event, model=name)
            if event.finish_reason == "error":
                raise APIError(event.error or "generation failed", None, 500, "server_error")
            self._push("event", event)
