"""The routes: GET /v1/models, POST /v1/chat/completions, POST /v1/completions (SSE or one body), GET /metrics.

build_routes() returns plain Starlette/FastAPI routes, so the same ones serve `localspec serve` (create_app) and
the chat app's server (`python app.py --api` hands them to Gradio's FastAPI app). Errors are answered by each route
itself (an app-level exception handler would not travel with the routes).
"""

from __future__ import annotations

import asyncio
import json

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.middleware import Middleware

from .admission import Admission, QueueFull
from .auth import key_matches
from .guard import AccessPolicy, HostGuard
from .metrics import CONTENT_TYPE, MetricsRecorder
from .responses import Collector
from .runner import Backend, Job, check_model
from .schemas import MAX_BODY_BYTES, APIError, parse_request

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


async def next_item(job: Job, request: Request):
    """The job's next item; while waiting, a client that went away cancels the job (asyncio.CancelledError)."""
    while True:
        try:
            return await asyncio.wait_for(job.items.get(), DISCONNECT_POLL_S)
        except asyncio.TimeoutError:
            if await request.is_disconnected():
                job.cancel.set()
                raise asyncio.CancelledError from None


def build_routes(backend: Backend, admission: Admission, metrics: MetricsRecorder | None, api_key: str | None) -> list:
    router = APIRouter()

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

    @router.get("/v1/models")
    async def models(request: Request):
        try:
            check_key(request)
        except APIError as exc:
            return error_response(exc)
        name, _session = backend.current()
        data = [
            {
                "id": p.name,
                "object": "model",
                "created": 0,
                "owned_by": "localspec",
                "localspec": {
                    "loaded": p.name == name,
                    "proposers": list(p.proposers),
                    "default_proposer": p.default_proposer,
                    "k": p.k,
                    "adaptive": p.adaptive,
                    "tree_nodes": p.tree_nodes,
                },
            }
            for p in backend.pairs
        ]
        return JSONResponse({"object": "list", "data": data})

    @router.get("/metrics")
    async def metrics_route(request: Request):
        try:
            check_key(request)
        except APIError as exc:
            return error_response(exc)
        body = metrics.exposition() if metrics is not None else b""
        return Response(body, media_type=CONTENT_TYPE)

    async def generate(request: Request, endpoint: str):
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
            try:
                first = await next_item(job, request)
            except asyncio.CancelledError:
                job.cancel.set()
                raise
            if first[0] == "error":
                raise first[1]
        except APIError as exc:
            return error_response(exc)
        if parsed.stream:
            return StreamingResponse(
                stream(job, first, request),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        try:
            collector = Collector(parsed, job.tokenizer)
            item = first
            while item[0] == "event":
                collector.add(item[1])
                if collector.done:
                    job.cancel.set()
                    break
                item = await next_item(job, request)
            if item[0] == "error":
                raise item[1]
            return JSONResponse(collector.final(job.prompt_tokens))
        except APIError as exc:
            return error_response(exc)
        finally:
            job.cancel.set()

    async def stream(job: Job, first, request: Request):
        parsed = job.request
        collector = Collector(parsed, job.tokenizer)
        try:
            yield sse(collector.chunk("", [], first=True))
            item = first
            while item[0] == "event":
                offset = collector.sent
                piece, tokens = collector.add(item[1])
                if collector.done:
                    job.cancel.set()
                    if piece or tokens:
                        yield sse(collector.chunk(piece, tokens, offset=offset))
                    yield sse(collector.chunk("", [], collector.finish_reason))
                    break
                if piece or tokens:
                    yield sse(collector.chunk(piece, tokens, offset=offset))
                item = await job.items.get()
            if item[0] == "error":
                yield sse(item[1].body())
            elif item[0] == "end" and not collector.done:
                yield sse(collector.chunk("", [], "stop"))
            if parsed.include_usage or parsed.extension.provenance:
                yield sse(collector.usage_chunk(job.prompt_tokens))
            yield sse("[DONE]")
        finally:  # the client went away (the task is cancelled) or the answer ended: stop the engine either way
            job.cancel.set()

    @router.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await generate(request, "chat")

    @router.post("/v1/completions")
    async def completions(request: Request):
        return await generate(request, "completions")

    return list(router.routes)


def create_app(
    backend: Backend,
    admission: Admission,
    metrics: MetricsRecorder | None,
    api_key: str | None,
    policy: AccessPolicy = AccessPolicy("127.0.0.1"),
) -> FastAPI:
    """The API on its own server; `policy` (the Host check and CORS, server/guard.py) wraps every route."""
    return FastAPI(
        title="localspec",
        routes=build_routes(backend, admission, metrics, api_key),
        middleware=[Middleware(HostGuard, policy=policy)],
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
