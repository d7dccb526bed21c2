"""The flow of `POST /v1/embeddings`: read and map the body, check that the model embeds, take
a place, send, answer, count it.

    return await embed(request, parts)

The body is mapped as a batch line to `/v1/embeddings` is (`bodies.to_embed_asked`), sent as
`EmbedRequest`s of at most `embed_parts.PART_INPUTS` inputs each, in base64, so every result
fits in one record (`ops.gateway.embed_parts`), and answered with OpenAI's embeddings list,
floats or base64 as asked (the `openai` SDK asks base64 when its caller names no format, and
decodes it). Every answer
carries `x-request-id`; one from a worker `x-tokenmill-worker` too. A model the fleet serves
for generation only: 400 `unsupported_task`. A client gone before its answer: 499, and the
request is cancelled.
"""

from __future__ import annotations

import asyncio
import time
from typing import cast

import msgspec
from fastapi import Request
from fastapi.responses import Response

from messages.embedding import EmbedRequest, EmbedResult
from messages.openai_batch import EMBEDDINGS_URL
from messages.openai_batch_answers import answer_line
from ops.gateway.bodies import parse_body, read_body
from ops.gateway.embed_parts import joined, split
from ops.gateway.errors import ApiError
from ops.gateway.fleet import EMBED
from ops.gateway.routes.deps import Parts
from ops.gateway.routes.generating import Timing, check_task, in_place, span_of, worker_header

_encoder = msgspec.json.Encoder()


async def embed(request: Request, parts: Parts) -> Response:
    """Answer one `POST /v1/embeddings` (its key already checked by the router)."""
    gateway, metrics = parts.gateway, parts.metrics
    timing = Timing(EMBEDDINGS_URL, time.monotonic())
    request_id = gateway.new_id()
    named = {"x-request-id": request_id}
    try:
        body = parse_body(await read_body(request, gateway.settings.max_body_bytes))
        asked = gateway.embed_asked(body, request_id)
        named.update(asked.ignored_header)
        check_task(parts, asked.request.model, EMBEDDINGS_URL, EMBED)
        sent = split(asked.request)
        with span_of(request, EMBEDDINGS_URL, request_id) as trace:
            result = await in_place(
                request,
                gateway,
                [p.id for p in sent],
                lambda: _round_trip(parts, asked.request, sent, trace),
            )
    except ApiError as exc:
        exc.headers.update(named)
        timing.count(metrics, exc.status, exc.code or "", stream=False)
        raise
    finally:
        metrics.in_flight.set(gateway.in_flight)
        metrics.dropped.set(gateway.replies.dropped)
    if result is None:  # the client left; its request was cancelled
        metrics.requests.labels(timing.endpoint, "499", "client_disconnected").inc()
        return Response(status_code=499)
    status, answer, code = _answered(result)
    timing.count(metrics, status, code, stream=False)
    return Response(
        answer,
        status_code=status,
        media_type="application/json",
        headers=named | worker_header(result.worker),
    )


async def _round_trip(
    parts: Parts, asked: EmbedRequest, sent: list[EmbedRequest], trace: list[tuple[str, bytes]]
) -> EmbedResult:
    """`asked`'s parts `sent` (`embed_parts.split`) sent at once, their results joined; when one
    part fails to come back (503, 504), the others are cancelled at the workers."""
    gateway = parts.gateway
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(gateway.result(one, trace)) for one in sent]
    except BaseExceptionGroup as failed:
        for one in sent:
            gateway.cancel_later(one.id, "part_failed")
        raise failed.exceptions[0] from None
    results = [task.result() for task in tasks]
    if not all(isinstance(r, EmbedResult) for r in results):  # a worker's bug
        raise ApiError(502, "the worker answered with a generation result", code="bad_result")
    return joined(asked, cast(list[EmbedResult], results))


def _answered(result: EmbedResult) -> tuple[int, bytes, str]:
    """The status, JSON body and error code ("" when none) answering `result`."""
    response = answer_line(result.id, EMBEDDINGS_URL, result).response
    assert response is not None
    code = str(result.error.code) if result.error is not None else ""
    return response.status_code, _encoder.encode(response.body), code
