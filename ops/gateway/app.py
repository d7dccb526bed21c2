"""The gateway's HTTP surface: FastAPI routes over `Gateway`, `Replies` and `FleetWatch`.

FastAPI on uvicorn because it is the convention of OpenAI-compatible servers in Python (vLLM,
SGLang, LiteLLM and llama-cpp-python's server all are) and what the project's origin
describes: an asyncio server, so the Kafka clients (aiokafka) share its event loop, with
streaming responses for Server-Sent Events. Bodies are not declared as pydantic models: they
go through the batch mapper (`ops.gateway.bodies`), the one mapping of OpenAI bodies.

    POST /v1/completions, POST /v1/chat/completions   (`stream: true`: SSE)
    GET  /v1/models                                   what the fleet serves
    /v1/files, /v1/batches                            the Batch API (`ops.gateway.batch_routes`)
    GET  /healthz, GET /metrics                       no key asked
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException

from messages.openai_batch import CHAT_COMPLETIONS_URL, COMPLETIONS_URL
from ops.gateway.batch_routes import batch_router
from ops.gateway.batch_runner import BatchRunner
from ops.gateway.bodies import Asked, parse_body, read_body, to_asked
from ops.gateway.errors import ApiError, error_body, unauthorized
from ops.gateway.fleet import FleetWatch
from ops.gateway.keys import KeyCheck
from ops.gateway.metrics import GatewayMetrics
from ops.gateway.replies import Replies
from ops.gateway.service import Gateway
from ops.gateway.tracing import request_span

log = structlog.get_logger("tokenmill.gateway")
T = TypeVar("T")


def build_app(
    gateway: Gateway,
    keys: KeyCheck,
    fleet: FleetWatch | None = None,
    batches: BatchRunner | None = None,
) -> FastAPI:
    """The ASGI app; its lifespan starts and stops `gateway.replies`, `fleet` and `batches`
    (None: no /v1/files nor /v1/batches)."""
    metrics = GatewayMetrics()
    replies: Replies = gateway.replies
    settings = gateway.settings

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        await replies.start()
        if fleet is not None:
            await fleet.start()
        if batches is not None:
            await batches.start()
        log.info("gateway_started", reply_topic=replies.reply_topic, keys=keys.required)
        try:
            yield
        finally:
            await gateway.stop()
            if batches is not None:
                await batches.stop()
            if fleet is not None:
                await fleet.stop()
            await replies.stop()
            log.info("gateway_stopped", dropped=replies.dropped)

    app = FastAPI(title="tokenmill gateway", lifespan=lifespan, docs_url=None, redoc_url=None)
    if batches is not None:
        app.include_router(batch_router(batches, batches.files, keys, settings.max_file_bytes))

    @app.exception_handler(ApiError)
    async def api_error(_request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid_parameter(_request: Request, exc: RequestValidationError) -> JSONResponse:
        where = ".".join(str(part) for part in exc.errors()[0].get("loc", ())) or None
        body = error_body(400, f"invalid parameter {where}", code="invalid_request", param=where)
        return JSONResponse(body, status_code=400)

    @app.exception_handler(HTTPException)
    async def http_error(_request: Request, exc: HTTPException) -> JSONResponse:
        return JSONResponse(
            error_body(exc.status_code, str(exc.detail)), status_code=exc.status_code
        )

    @app.exception_handler(Exception)
    async def unexpected(_request: Request, exc: Exception) -> JSONResponse:
        log.error("gateway_error", error=repr(exc))  # never a body: it may hold a prompt
        return JSONResponse(
            error_body(500, "internal error in the gateway", code="internal_error"),
            status_code=500,
        )

    async def generate(request: Request, url: str) -> Response:
        started = time.monotonic()
        endpoint = url.removeprefix("/v1/")
        stream = False
        request_id = gateway.new_id()
        named = {"x-request-id": request_id}  # as OpenAI's: names the request in logs
        try:
            if not keys.allows(request.headers.get("authorization")):
                raise unauthorized()
            body = parse_body(await read_body(request, settings.max_body_bytes))
            asked = to_asked(
                url,
                body,
                request_id,
                default_max_tokens=settings.default_max_tokens,
                strict_fields=settings.strict_fields,
            )
            named.update(asked.ignored_header)
            stream = asked.stream
            traced = request_span(
                url,
                request_id,
                request.headers.get("traceparent"),
                request.headers.get("tracestate"),
            )
            with traced as trace:
                return await answer(request, asked, trace, started, named)
        except ApiError as exc:
            exc.headers.update(named)
            metrics.requests.labels(endpoint, str(exc.status), exc.code or "").inc()
            metrics.latency.labels(endpoint, str(stream).lower()).observe(
                time.monotonic() - started
            )
            raise
        finally:
            metrics.in_flight.set(gateway.in_flight)
            metrics.dropped.set(replies.dropped)

    async def answer(
        request: Request,
        asked: Asked,
        trace: list[tuple[str, bytes]],
        started: float,
        named: dict[str, str],
    ) -> Response:
        """Send `asked` in one of the --max-inflight places and answer it."""
        endpoint = asked.url.removeprefix("/v1/")
        place = gateway.admit()
        metrics.in_flight.set(gateway.in_flight)
        streaming = False  # once true, the events hold the place
        try:
            if not asked.stream:
                done = await _unless_disconnected(request, gateway.complete(asked, trace))
                if done is None:  # the client left: stop the work it asked for
                    gateway.cancel_later(asked.request.id, "client_disconnected")
                    metrics.requests.labels(endpoint, "499", "client_disconnected").inc()
                    return Response(status_code=499)  # nginx's "client closed request"
                status, body, worker = done
                headers = named | ({"x-tokenmill-worker": worker} if worker else {})
                return _answered(metrics, endpoint, status, body, started, headers)
            answered = await gateway.stream(asked, trace, place, served_alone())
            streaming = not isinstance(answered[0], int)
        finally:
            if not streaming:
                place.release()
        if isinstance(answered[0], int):
            return _answered(metrics, endpoint, answered[0], answered[1], started, named)
        first, events = answered
        return StreamingResponse(
            _measured(metrics, endpoint, started, first, events),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **named},
        )

    def served_alone() -> str:
        """The one model the fleet serves, or "" (none known, or several)."""
        served = fleet.fleet.models() if fleet is not None else []
        return served[0].name if len(served) == 1 else ""

    @app.post(COMPLETIONS_URL)
    async def completions(request: Request) -> Response:
        return await generate(request, COMPLETIONS_URL)

    @app.post(CHAT_COMPLETIONS_URL)
    async def chat_completions(request: Request) -> Response:
        return await generate(request, CHAT_COMPLETIONS_URL)

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        if not keys.allows(request.headers.get("authorization")):
            raise unauthorized()
        served = fleet.fleet.models() if fleet is not None else []
        data = [
            {"id": m.name, "object": "model", "created": m.since, "owned_by": "tokenmill"}
            for m in served
        ]
        return {"object": "list", "data": data}

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        return {"status": "ok", "in_flight": gateway.in_flight, "reply_topic": replies.reply_topic}

    @app.get("/metrics")
    async def prometheus() -> Response:
        metrics.in_flight.set(gateway.in_flight)
        metrics.dropped.set(replies.dropped)
        metrics.batches_running.set(batches.running if batches is not None else 0)
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app


async def _unless_disconnected(request: Request, work: Awaitable[T]) -> T | None:
    """`work`'s value, or None when the client disconnects first (`work` is then cancelled).
    The body has been read, so the next ASGI message can only be the disconnect."""

    async def gone() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    working = asyncio.ensure_future(work)
    watching = asyncio.ensure_future(gone())
    try:
        await asyncio.wait({working, watching}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watching.cancel()
        if not working.done():
            working.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await watching
    if working.cancelled():
        return None
    if not working.done():  # cancelled just now: let it finish its cleanup
        with contextlib.suppress(asyncio.CancelledError):
            await working
        return None
    return working.result()


def _answered(
    metrics: GatewayMetrics,
    endpoint: str,
    status: int,
    body: Any,
    started: float,
    headers: dict[str, str],
) -> JSONResponse:
    code = (body.get("error") or {}).get("code") if isinstance(body, dict) else None
    metrics.requests.labels(endpoint, str(status), code or "").inc()
    metrics.latency.labels(endpoint, "false").observe(time.monotonic() - started)
    return JSONResponse(body, status_code=status, headers=headers)


async def _measured(
    metrics: GatewayMetrics,
    endpoint: str,
    started: float,
    first: bytes,
    events: AsyncIterator[bytes],
) -> AsyncIterator[bytes]:
    yield first
    async for event in events:
        yield event
    metrics.requests.labels(endpoint, "200", "").inc()
    metrics.latency.labels(endpoint, "true").observe(time.monotonic() - started)
