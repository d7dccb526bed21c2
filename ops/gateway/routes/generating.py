"""The one flow of `POST /v1/completions` and `POST /v1/chat/completions`: read and map the
body, take a place, send, answer (JSON or SSE), count it.

    return await generate(request, COMPLETIONS_URL, parts)

Every answer carries `x-request-id` (the id of the `GenerateRequest`); a non-streamed one
`x-tokenmill-worker` too. A completions body with several prompts is asked as one request per
prompt (`prompt_list`). A client gone before its answer: 499, and the request is cancelled.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from messages.openai_batch import COMPLETIONS_URL
from ops.gateway.bodies import Asked, parse_body, read_body
from ops.gateway.errors import ApiError, no_worker, wrong_task
from ops.gateway.fleet import EMBED, GENERATE
from ops.gateway.metrics import GatewayMetrics
from ops.gateway.outcomes import Refused, Streaming
from ops.gateway.prompt_list import merge_answers, split_prompts
from ops.gateway.routes.deps import Parts
from ops.gateway.routes.disconnect import unless_disconnected
from ops.gateway.service import Gateway
from ops.gateway.tracing import request_span

T = TypeVar("T")


async def generate(request: Request, url: str, parts: Parts) -> Response:
    """Answer the generation request `request` to `url` (its body read here)."""
    gateway, metrics = parts.gateway, parts.metrics
    started = time.monotonic()
    stream = False
    request_id = gateway.new_id()
    named = {"x-request-id": request_id}  # as OpenAI's: names the request in logs
    try:
        body = parse_body(await read_body(request, gateway.settings.max_body_bytes))
        if url == COMPLETIONS_URL and (bodies := split_prompts(body)) is not None:
            return await _answer_prompts(request, parts, bodies, Timing(url, started), named)
        asked = gateway.asked(url, body, request_id)
        stream = asked.stream
        named.update(asked.ignored_header)  # the fields the mapping let by unread
        check_served(parts, asked)
        with span_of(request, url, request_id) as trace:
            return await _answer(request, parts, asked, trace, Timing(url, started), named)
    except ApiError as exc:
        exc.headers.update(named)
        Timing(url, started).count(metrics, exc.status, exc.code or "", stream)
        raise
    finally:
        metrics.in_flight.set(gateway.in_flight)
        metrics.dropped.set(gateway.replies.dropped)


class Timing:
    """One request's endpoint label and arrival, and its count once answered."""

    def __init__(self, url: str, started: float) -> None:
        self.endpoint = url.removeprefix("/v1/")
        self.started = started

    def count(self, metrics: GatewayMetrics, status: int, code: str, stream: bool) -> None:
        metrics.requests.labels(self.endpoint, str(status), code).inc()
        metrics.latency.labels(self.endpoint, str(stream).lower()).observe(
            time.monotonic() - self.started
        )


async def _answer(
    request: Request,
    parts: Parts,
    asked: Asked,
    trace: list[tuple[str, bytes]],
    timing: Timing,
    named: dict[str, str],
) -> Response:
    """Send `asked` in one of the --max-inflight places and answer it."""
    gateway, metrics = parts.gateway, parts.metrics
    if not asked.stream:
        done = await whole_answer(request, gateway, asked, trace)
        if done is None:  # the client left; its request was cancelled
            metrics.requests.labels(timing.endpoint, "499", "client_disconnected").inc()
            return Response(status_code=499)  # nginx's "client closed request"
        status, body, worker = done
        return _json(metrics, timing, status, body, named | worker_header(worker))
    started = await stream_answer(parts, asked, trace)
    if isinstance(started, Refused):
        return _json(metrics, timing, started.status, started.body, named)
    return StreamingResponse(
        _measured(metrics, timing, started.first, started.events),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **named},
    )


async def _answer_prompts(
    request: Request,
    parts: Parts,
    bodies: list[dict[str, Any]],
    timing: Timing,
    named: dict[str, str],
) -> Response:
    """`/v1/completions` with several prompts: one request each (ids `<id>-<i>`), sent
    together in one place, answered as one (`prompt_list.merge_answers`)."""
    gateway = parts.gateway
    request_id = named["x-request-id"]
    asked = [
        gateway.asked(COMPLETIONS_URL, body, f"{request_id}-{i}") for i, body in enumerate(bodies)
    ]
    named.update(asked[0].ignored_header)
    check_served(parts, asked[0])

    def cancel_all() -> None:
        for one in asked:
            gateway.cancel_later(one.request.id, "client_disconnected")

    place = gateway.admit()
    try:
        with span_of(request, COMPLETIONS_URL, request_id) as trace:
            work = asyncio.gather(*(gateway.complete(one, trace) for one in asked))
            done = await unless_disconnected(request, work, cancel_all)
    finally:
        place.release()
    if done is None:
        parts.metrics.requests.labels(timing.endpoint, "499", "client_disconnected").inc()
        return Response(status_code=499)
    status, body = merge_answers([(s, b) for s, b, _ in done], n=asked[0].request.n)
    return _json(parts.metrics, timing, status, body, named)


def check_served(parts: Parts, asked: Asked) -> None:
    """503 `no_worker` at once when no live worker serves the model `asked` names; 400
    `unsupported_task` when those that serve it only embed."""
    check_task(parts, asked.request.model, asked.url, GENERATE)


def check_task(parts: Parts, model: str | None, url: str, task: str) -> None:
    """503 `no_worker` at once when no live worker serves `model` (None: any); 400
    `unsupported_task` when those that serve it do not do `task` (EMBED or GENERATE)."""
    if parts.fleet is None:
        return
    if parts.fleet.refuses(model):
        raise no_worker(model)
    if (other := parts.fleet.other_task(model, task)) is not None:
        raise wrong_task(model, url, embeds=other == EMBED)


def span_of(
    request: Request, url: str, request_id: str
) -> AbstractContextManager[list[tuple[str, bytes]]]:
    """The request's span, a child of the client's `traceparent` when it sent one; the
    headers that carry it on to the workers."""
    headers = request.headers
    return request_span(url, request_id, headers.get("traceparent"), headers.get("tracestate"))


async def whole_answer(
    request: Request, gateway: Gateway, asked: Asked, trace: list[tuple[str, bytes]]
) -> tuple[int, Any, str] | None:
    """`asked` sent in one of the --max-inflight places and its answer awaited (status, body,
    worker), or None when the client left first (the request is then cancelled)."""
    return await in_place(
        request, gateway, asked.request.id, lambda: gateway.complete(asked, trace)
    )


async def in_place(
    request: Request,
    gateway: Gateway,
    request_id: str | Sequence[str],
    work: Callable[[], Awaitable[T]],
) -> T | None:
    """`work()` (the round trip of request `request_id`, or of the requests it lists) run in
    one of the --max-inflight places (429 when none is free), or None when the client left
    first (the requests are then cancelled)."""
    ids = [request_id] if isinstance(request_id, str) else list(request_id)

    def cancel() -> None:
        for one in ids:
            gateway.cancel_later(one, "client_disconnected")

    place = gateway.admit()
    try:
        return await unless_disconnected(request, work(), cancel)
    finally:
        place.release()


async def stream_answer(
    parts: Parts, asked: Asked, trace: list[tuple[str, bytes]]
) -> Refused | Streaming:
    """`asked` sent in one of the --max-inflight places, as a stream: a `Refused` (its place
    released), or the `Streaming` events, which hold the place until they end."""
    gateway = parts.gateway
    place = gateway.admit()
    parts.metrics.in_flight.set(gateway.in_flight)
    try:
        started = await gateway.stream(
            asked, trace, place, served_alone(parts), tool_format(parts, asked)
        )
    except BaseException:
        place.release()
        raise
    if isinstance(started, Refused):
        place.release()
    return started


def tool_format(parts: Parts, asked: Asked) -> str:
    """The tool-call format of the model `asked` goes to, as its workers announce it ("":
    tokenmill's default, also when no fleet is watched)."""
    if parts.fleet is None or not asked.tool_call:
        return ""
    return parts.fleet.fleet.tool_format(asked.request.model)


def served_alone(parts: Parts) -> str:
    """The one model the fleet serves, or "" (none known, or several)."""
    served = parts.fleet.fleet.models() if parts.fleet is not None else []
    return served[0].name if len(served) == 1 else ""


def worker_header(worker: str) -> dict[str, str]:
    """`x-tokenmill-worker`, naming the worker that answered (none when it is not known)."""
    return {"x-tokenmill-worker": worker} if worker else {}


def _json(
    metrics: GatewayMetrics, timing: Timing, status: int, body: Any, headers: dict[str, str]
) -> JSONResponse:
    code = (body.get("error") or {}).get("code") if isinstance(body, dict) else None
    timing.count(metrics, status, code or "", stream=False)
    return JSONResponse(body, status_code=status, headers=headers)


async def _measured(
    metrics: GatewayMetrics, timing: Timing, first: bytes, events: AsyncIterator[bytes]
) -> AsyncIterator[bytes]:
    yield first
    async for event in events:
        yield event
    timing.count(metrics, 200, "", stream=True)
