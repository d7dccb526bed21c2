"""`POST /v1/responses`: a Responses request run as the chat completion it amounts to.

    return await create_response(request, parts)

The body is mapped onto a chat completions body (`messages.openai_responses.to_chat`), which
goes through the chat door's own mapping (`to_asked`) and round trip (`Gateway.complete`,
`Gateway.stream`); the chat answer comes back as a Response. `stream: true` answers with the
Responses API's Server-Sent Events, each `event: <type>\\ndata: <json>\\n\\n`, built from the
chat stream's chunks (`messages.openai_responses_events`). An answer the chat door will not
stream (today: one with tools) is run whole and sent as the same events.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from messages.errors import BatchLineRefused
from messages.openai_batch import CHAT_COMPLETIONS_URL
from messages.openai_batch_mapping import LineCode
from messages.openai_responses import RESPONSES_URL, ResponsesAsked, to_chat
from messages.openai_responses_answers import to_response
from messages.openai_responses_events import ResponseEvents, replayed
from ops.gateway.bodies import Asked, parse_body, read_body
from ops.gateway.errors import ApiError
from ops.gateway.outcomes import Refused
from ops.gateway.routes.deps import Parts
from ops.gateway.routes.generating import (
    check_served,
    served_alone,
    span_of,
    stream_answer,
    whole_answer,
)
from ops.gateway.service import Gateway

_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
Completed = tuple[int, object, str]  # `Gateway.complete`'s status, body and worker


async def create_response(request: Request, parts: Parts) -> Response:
    """Answer one `POST /v1/responses` (its key already checked by the router). Raises
    `ApiError` (with `x-request-id`) for what is refused."""
    gateway = parts.gateway
    request_id = gateway.new_id()
    named = {"x-request-id": request_id}
    try:
        body = parse_body(await read_body(request, gateway.settings.max_body_bytes))
        try:
            responses = to_chat(body)
        except BatchLineRefused as exc:
            raise ApiError.refused(exc) from None
        asked, replay = _chat_asked(responses, request_id, gateway)
        named.update(asked.ignored_header)
        check_served(parts, asked)
        with span_of(request, RESPONSES_URL, request_id) as trace:
            if responses.stream and not replay:
                return await _streamed(responses, asked, trace, parts, named)
            done = await whole_answer(request, gateway, asked, trace)
            return _whole(done, responses, asked, named)
    except ApiError as exc:
        exc.headers.update(named)
        raise


def _chat_asked(responses: ResponsesAsked, request_id: str, gateway: Gateway) -> tuple[Asked, bool]:
    """The chat request, and whether a streamed Response replays a whole answer (the chat
    door refuses to stream it)."""
    chat = responses.chat
    if responses.stream:
        streamed = {**chat, "stream": True, "stream_options": {"include_usage": True}}
        try:
            return gateway.asked(CHAT_COMPLETIONS_URL, streamed, request_id), False
        except ApiError as exc:
            if exc.code != LineCode.UNSUPPORTED_PARAMETER:
                raise
    return gateway.asked(CHAT_COMPLETIONS_URL, chat, request_id), responses.stream


def _whole(
    done: Completed | None,
    responses: ResponsesAsked,
    asked: Asked,
    named: dict[str, str],
) -> Response:
    """The answer to a request run whole: a Response, or its events when it asked to stream."""
    if done is None:  # the client left; its request was cancelled
        return Response(status_code=499)
    status, body, worker = done
    headers = named | ({"x-tokenmill-worker": worker} if worker else {})
    if status != 200 or not isinstance(body, dict):
        return JSONResponse(body, status_code=status, headers=headers)
    response = to_response(responses, body, f"resp_{asked.request.id}")
    if not responses.stream:
        return JSONResponse(response, headers=headers)
    events = ResponseEvents(responses, response["id"], response["created_at"], response["model"])
    sent = [*events.start(), *(e for chunk in replayed(body) for e in events.chunk(chunk))]
    sent += events.finish()

    async def replay() -> AsyncIterator[bytes]:
        for event in sent:
            yield sse(event)

    return StreamingResponse(
        replay(), media_type="text/event-stream", headers=_SSE_HEADERS | headers
    )


async def _streamed(
    responses: ResponsesAsked,
    asked: Asked,
    trace: list[tuple[str, bytes]],
    parts: Parts,
    named: dict[str, str],
) -> Response:
    started = await stream_answer(parts, asked, trace)
    if isinstance(started, Refused):
        return JSONResponse(started.body, status_code=started.status, headers=named)
    first, chunks = started.first, started.events
    model = asked.request.model or served_alone(parts)
    events = ResponseEvents(responses, f"resp_{asked.request.id}", int(time.time()), model)
    return StreamingResponse(
        _events(events, first, chunks), media_type="text/event-stream", headers=_SSE_HEADERS | named
    )


async def _events(
    events: ResponseEvents, first: bytes, chunks: AsyncIterator[bytes]
) -> AsyncIterator[bytes]:
    """The Response's events from the chat stream's; closing this closes the chat stream (the
    client went away: its `finally` cancels the request)."""
    try:
        for event in events.start():
            yield sse(event)
        failed = False
        async for data in _chat_data(first, chunks):
            for chunk in chat_chunks(data):
                for event in events.chunk(chunk):
                    failed = failed or event["type"] == "error"
                    yield sse(event)
        if not failed:
            for event in events.finish():
                yield sse(event)
    finally:
        if isinstance(chunks, AsyncGenerator):
            await chunks.aclose()


async def _chat_data(first: bytes, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    yield first
    async for data in chunks:
        yield data


def chat_chunks(data: bytes) -> list[dict[str, Any]]:
    """The JSON objects of the chat stream's SSE `data:` lines in `data` (`[DONE]` skipped)."""
    found = []
    for line in data.splitlines():
        if line.startswith(b"data:"):
            payload = line[5:].strip()
            if payload and payload != b"[DONE]":
                found.append(json.loads(payload))
    return found


def sse(event: dict[str, Any]) -> bytes:
    """One Responses event as OpenAI sends it: its type as the SSE `event`, then the data."""
    data = json.dumps(event, separators=(",", ":"))
    return f"event: {event['type']}\ndata: {data}\n\n".encode()
