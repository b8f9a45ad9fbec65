"""The routes: GET /v1/models, GET /v1/models/{id}, POST /v1/chat/completions, POST /v1/completions (SSE or one
body), GET /health, GET /metrics.

build_routes() returns plain Starlette/FastAPI routes, so the same ones serve `localspec serve` (create_app) and
the chat app's server (`python app.py --api` hands them to Gradio's FastAPI app). Errors are answered by each route
itself (an app-level exception handler would not travel with the routes).
"""

from __future__ import annotations

import asyncio
import json
import time

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware import Middleware

from .admission import Admission, QueueFull
from .auth import key_matches
from .guard import AccessPolicy, HostGuard
from .metrics import CONTENT_TYPE, MetricsRecorder, Outcome
from .responses import Collector
from .runner import Backend, Job, check_model, pair_named, slug
from .schemas import MAX_BODY_BYTES, APIError, parse_request

CREATED = int(time.time())  # when this server started: the models' `created`
ROUTE_METHODS = {"/v1/models": "GET", "/v1/chat/completions": "POST", "/v1/completions": "POST"}
DISCONNECT_POLL_S = 0.25  # how often a request that has sent nothing yet checks that its client is still there


def error_response(exc: APIError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


def sse(body: dict | str) -> bytes:
    data = body if isinstance(body, str) else json.dumps(body, ensure_ascii=False, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


def is_json(content_type: str | None) -> bool:
    """application/json or any +json type, parameters (charset) allowed."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


async def read_json(request: Request):
    """The body as JSON: refused (415) unless sent as JSON, (413) past MAX_BODY_BYTES however it is framed."""
    if not is_json(request.headers.get("content-type")):
        raise APIError(
            "send the request body as JSON (Content-Type: application/json)", None, 415, code="unsupported_media_type"
        )
    too_large = APIError(f"the request body is larger than {MAX_BODY_BYTES} bytes", None, 413)
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > MAX_BODY_BYTES:
        raise too_large
    raw = bytearray()
    async for chunk in request.stream():  # a chunked body has no Content-Length: stop reading past the cap
        raw += chunk
        if len(raw) > MAX_BODY_BYTES:
            raise too_large
    try:
        return json.loads(raw)
    except RecursionError:
        raise APIError("the request body nests too deeply to be read") from None
    except (ValueError, UnicodeDecodeError):
        raise APIError("the request body is not valid JSON") from None


class ClientGone(Exception):
    """The client of a request that has not been answered yet went away (its job is cancelled)."""


class Items:
    """A non-streamed job's items as the route waits for them; every DISCONNECT_POLL_S (even while events keep
    coming) it checks that the client is still there, and cancels the job when it is not (ClientGone)."""

    def __init__(self, job: Job, request: Request) -> None:
        self.job, self.request = job, request
        self.checked = time.monotonic()

    async def next(self):
        while True:
            if time.monotonic() - self.checked >= DISCONNECT_POLL_S:
                self.checked = time.monotonic()
                if await self.request.is_disconnected():
                    self.job.cancel.set()
                    raise ClientGone
            try:
                return await asyncio.wait_for(self.job.items.get(), DISCONNECT_POLL_S)
            except asyncio.TimeoutError:
                continue


def not_found(path: str) -> JSONResponse:
    return error_response(
        APIError(
            f"there is no route {path[:200]}; this server has GET /v1/models, GET /v1/models/{{id}}, "
            "POST /v1/chat/completions, POST /v1/completions, GET /health, GET /metrics",
            None,
            404,
            code="not_found",
        )
    )


def build_routes(backend: Backend, admission: Admission, metrics: MetricsRecorder | None, api_key: str | None) -> list:
    router = APIRouter()
    if metrics is not None:
        metrics.model_name = lambda: backend.current()[0]

    def check_key(request: Request) -> None:
        if api_key is not None and not key_matches(api_key, request.headers.get("authorization")):
            raise APIError(
                "a valid API key is required: send 'Authorization: Bearer <LOCALSPEC_API_KEY>'",
                None,
                401,
                "invalid_request_error",
                "invalid_api_key",
                {"WWW-Authenticate": "Bearer"},
            )

    def model_card(pair, loaded_name: str | None) -> dict:
        return {
            "id": slug(pair.name),
            "object": "model",
            "created": CREATED,
            "owned_by": "localspec",
            "localspec": {
                "name": pair.name,
                "loaded": pair.name == loaded_name,
                "proposers": list(pair.proposers),
                "default_proposer": pair.default_proposer,
                "k": pair.k,
                "adaptive": pair.adaptive,
                "tree_nodes": pair.tree_nodes,
            },
        }

    @router.get("/v1/models")
    async def models(request: Request):
        try:
            check_key(request)
        except APIError as exc:
            return error_response(exc)
        name, _session = backend.current()
        return JSONResponse({"object": "list", "data": [model_card(p, name) for p in backend.pairs]})

    @router.get("/v1/models/{model_id:path}")
    async def model(request: Request, model_id: str):
        try:
            check_key(request)
            asked = pair_named(backend, model_id)
            if asked is None:
                raise APIError(f"model {model_id!r} does not exist", "model", 404, code="model_not_found")
        except APIError as exc:
            return error_response(exc)
        pair = next(p for p in backend.pairs if p.name == asked)
        return JSONResponse(model_card(pair, backend.current()[0]))

    @router.get("/health")
    async def health(request: Request):
        name, session = backend.current()
        body = {"status": "ok" if session is not None else "no_model", "model": slug(name) if name else None}
        return JSONResponse(body, status_code=200 if session is not None else 503)

    @router.get("/metrics")
    async def metrics_route(request: Request):
        try:
            check_key(request)
        except APIError as exc:
            return error_response(exc)
        body = metrics.exposition() if metrics is not None else b""
        return Response(body, media_type=CONTENT_TYPE)

    def record(job: Job, collector: Collector | None, finish_reason: str | None = None) -> None:
        """Count the request once, with the finish reason and token count its response carried."""
        if metrics is None or job.model_name is None or job.recorded:
            return
        job.recorded = True
        if collector is None:
            outcome = Outcome(finish_reason or "error", job.prompt_tokens, 0, 0.0)
        else:
            outcome = collector.outcome(job.prompt_tokens, finish_reason)
        metrics.observe_end(outcome, model=job.model_name, source="api")

    async def generate(request: Request, endpoint: str):
        job = None
        try:
            check_key(request)
            parsed = parse_request(await read_json(request), endpoint)
            check_model(backend, parsed.model)
            try:
                job = Job(parsed, backend, admission, metrics)
            except QueueFull as exc:
                raise APIError(
                    str(exc), None, 429, "rate_limit_exceeded", "queue_full", {"Retry-After": str(exc.retry_after_s)}
                ) from None
            items = Items(job, request)
            first = await items.next()
            if first[0] == "error":
                raise first[1]
            if first[0] == "end":  # cancelled before it started
                raise ClientGone
        except APIError as exc:
            if job is not None:
                record(job, None, "error")
            return error_response(exc)
        except ClientGone:
            if job is not None:
                job.cancel.set()
                record(job, None, "cancelled")
            return Response(status_code=499)  # nobody reads it: the client is gone
        collector = Collector(parsed, job.tokenizer, job.fingerprint, job.notice)
        if parsed.stream:
            return StreamingResponse(
                stream(job, collector, first),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        try:
            item = first
            while item[0] == "event":
                collector.add(item[1])
                if collector.done:
                    job.cancel.set()
                    break
                item = await items.next()
            if item[0] == "error":
                raise item[1]
            if not collector.done:  # the engine ended without a finished event
                collector.finish_reason, collector.done = collector.finish_reason or "stop", True
            body = collector.final(job.prompt_tokens)  # the whole answer is delivered with it
            record(job, collector)
            return JSONResponse(body)
        except APIError as exc:
            record(job, collector, "error")
            return error_response(exc)
        except ClientGone:
            record(job, collector, "cancelled")
            return Response(status_code=499)
        finally:
            job.cancel.set()

    async def stream(job: Job, collector: Collector, first):
        parsed = job.request
        finish = None
        try:
            yield sse(collector.chunk("", [], first=True))
            item = first
            while item[0] == "event":
                offset = collector.sent
                piece, tokens = collector.add(item[1])
                if collector.done:
                    job.cancel.set()
                if piece or collector.new_calls or (tokens and collector.shows_tokens):
                    yield sse(collector.chunk(piece, tokens, offset=offset))
                collector.mark_delivered()  # reached only when the client took the chunk
                if collector.done:
                    break
                item = await job.items.get()
            if item[0] == "error":
                finish = "error"
                yield sse(item[1].body())
            else:
                finish = collector.finish_reason or "stop"
                yield sse(collector.chunk("", [], finish))
            if parsed.include_usage or parsed.extension.provenance:
                yield sse(collector.usage_chunk(job.prompt_tokens))
            yield sse("[DONE]")
        finally:  # the client went away (the task is cancelled) or the answer ended: stop the engine either way
            job.cancel.set()
            record(job, collector, finish or "cancelled")

    @router.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await generate(request, "chat")

    @router.post("/v1/completions")
    async def completions(request: Request):
        return await generate(request, "completions")

    # last: any other /v1 path (on the chat app's server too, where these routes come ahead of Gradio's)
    @router.api_route("/v1/{rest:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
    async def unknown(request: Request, rest: str):
        path = request.url.path.rstrip("/")
        allowed = ROUTE_METHODS.get(path) or ("GET" if path.startswith("/v1/models/") else None)
        if allowed is not None:
            message = f"{request.method} is not allowed on {path}; use {allowed}"
            return error_response(APIError(message, None, 405, code="method_not_allowed"))
        return not_found(request.url.path)

    return list(router.routes)


def create_app(
    backend: Backend,
    admission: Admission,
    metrics: MetricsRecorder | None,
    api_key: str | None,
    policy: AccessPolicy = AccessPolicy("127.0.0.1"),
) -> FastAPI:
    """The API on its own server; `policy` (the Host check and CORS, server/guard.py) wraps every route, and an
    unknown route gets an OpenAI-shaped 404."""
    app = FastAPI(
        title="localspec",
        routes=build_routes(backend, admission, metrics, api_key),
        middleware=[Middleware(HostGuard, policy=policy)],
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        if exc.status_code == 404:
            return not_found(request.url.path)
        if exc.status_code == 405:
            return error_response(APIError(f"{request.method} is not allowed on {request.url.path}", None, 405))
        return error_response(APIError(str(exc.detail), None, exc.status_code))

    return app
