"""The gateway's work for one HTTP request, apart from HTTP: admit, send, wait, answer.

    gateway = Gateway(settings, replies)
    place = gateway.admit()                           # or ApiError 429
    status, body, worker = await gateway.complete(asked)   # or ApiError 503 / 504; release
    result = await gateway.result(request, trace)     # any request's result (embeddings)
    started = await gateway.stream(asked, place)      # Refused(status, body), or Streaming:
                                                      # the SSE events, which release the place

Every request is sent with `reply_to` = this instance's reply topic (`Replies`); one that
times out, or whose streaming client goes away, gets a cancel record, so the worker stops it.
"""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import structlog

from messages.chunk import GenerateChunk
from messages.embedding import EmbedResult
from messages.openai_chat_tools import FUNCTIONS_SUFFIX, TOOLS_KEY
from messages.request_kinds import Request
from messages.result import GenerateResult
from messages.tool_parsing import stream_for
from ops.gateway.bodies import Asked, EmbedAsked, answer, to_asked, to_embed_asked
from ops.gateway.errors import ApiError, timed_out, too_many
from ops.gateway.outcomes import Refused, Streaming
from ops.gateway.replies import Replies, Reply
from ops.gateway.settings import GatewaySettings
from ops.gateway.sse import DONE, ChunkShape, StreamEvents, ToolText, error_event
from ops.gateway.tool_stream import CallText

log = structlog.get_logger("tokenmill.gateway")


def _bad_result() -> ApiError:
    """A generation answered with an `EmbedResult` (a worker's bug)."""
    return ApiError(502, "the worker answered with an embedding result", code="bad_result")


class Gateway:
    """Admission (`--max-inflight`), the request's round trip, and the cancels it owes."""

    def __init__(self, settings: GatewaySettings, replies: Replies, instance: str) -> None:
        self.settings = settings
        self.replies = replies
        self.instance = instance
        self.in_flight = 0
        self._cancels: set[asyncio.Task[None]] = set()  # held until sent

    def new_id(self) -> str:
        return f"gw-{self.instance}-{uuid.uuid4().hex[:16]}"

    def asked(self, url: str, body: dict[str, Any], request_id: str) -> Asked:
        """`body` to `url` mapped as this gateway's settings say (`bodies.to_asked`)."""
        return to_asked(
            url,
            body,
            request_id,
            default_max_tokens=self.settings.default_max_tokens,
            strict_fields=self.settings.strict_fields,
        )

    def embed_asked(self, body: dict[str, Any], request_id: str) -> EmbedAsked:
        """A `/v1/embeddings` `body` mapped as this gateway's settings say (`to_embed_asked`)."""
        return to_embed_asked(body, request_id, strict_fields=self.settings.strict_fields)

    def admit(self) -> Place:
        """One of `--max-inflight` places, or `ApiError` 429."""
        if self.in_flight >= self.settings.max_inflight:
            raise too_many(self.settings.max_inflight)
        self.in_flight += 1
        return Place(self)

    async def complete(
        self, asked: Asked, trace: list[tuple[str, bytes]]
    ) -> tuple[int, object, str]:
        """Send `asked`, wait for its result: its status and body (the batch mapper's shapes),
        and the worker that answered (its id; "" when the result does not say)."""
        reply = await self.result(asked.request, trace)
        if not isinstance(reply, GenerateResult):  # a worker's bug: not a generation's answer
            raise _bad_result()
        return *answer(asked, reply, int(time.time())), reply.worker

    async def result(
        self, request: Request, trace: list[tuple[str, bytes]]
    ) -> GenerateResult | EmbedResult:
        """Send `request`, wait for its result (a stream's chunks passed over); `ApiError` 503
        when the broker takes nothing, 504 at `--request-timeout` (the request is then
        cancelled)."""
        queue = self.replies.open(request.id)
        try:
            await self.replies.send(request, trace)
            deadline = time.monotonic() + self.settings.request_timeout
            while True:
                reply = await self._next(queue, deadline, request.id)
                if not isinstance(reply, GenerateChunk):
                    return reply
        finally:
            self.replies.close(request.id)

    async def stream(
        self,
        asked: Asked,
        trace: list[tuple[str, bytes]],
        place: Place,
        model: str = "",
        tool_format: str = "",
    ) -> Refused | Streaming:
        """Send `asked` and wait for its first reply: a `Refused`, else the `Streaming`
        events (the first and the rest). The events, once started, own the request and `place`:
        they release it and, when not iterated to the end (the client went away), cancel the
        request. (`place.release()` may be called again: it releases once.) `model`: the name
        the chunks carry when the body names none (chunks do not say which model made them);
        `tool_format`: the format its chat template writes tool calls in (`ModelRef.tool_format`,
        which the workers announce), for a request that may call tools under "auto"."""
        request_id = asked.request.id
        queue = self.replies.open(request_id)
        try:
            await self.replies.send(asked.request, trace)
            deadline = time.monotonic() + self.settings.request_timeout
            first = await self._next(queue, deadline, request_id)
        except BaseException:
            self.replies.close(request_id)
            raise
        if isinstance(first, GenerateResult) and first.error is not None:
            self.replies.close(request_id)
            return Refused(*answer(asked, first, int(time.time())))
        events = self._events(asked, queue, first, deadline, place, model, tool_format)
        return Streaming(await anext(events), events)  # started: its `finally` always runs

    async def _events(
        self,
        asked: Asked,
        queue: asyncio.Queue[Reply],
        reply: Reply,
        deadline: float,
        place: Place,
        model: str,
        tool_format: str,
    ) -> AsyncIterator[bytes]:
        request_id = asked.request.id
        shown = asked.request.model or model
        shape = ChunkShape(asked.url, request_id, shown, int(time.time()), asked.include_usage)
        tools = _tool_reader(asked, tool_format)
        functions = asked.request.metadata.get(TOOLS_KEY, "").endswith(FUNCTIONS_SUFFIX)
        events = StreamEvents(shape, asked.request.n, tools=tools, functions=functions)
        answered = False
        try:
            for sent in events.start():
                yield sent
            while isinstance(reply, GenerateChunk):
                for sent in events.chunk(reply):
                    yield sent
                reply = await self._next(queue, deadline, request_id)
            answered = True
            if isinstance(reply, EmbedResult):  # a worker's bug: not a generation's answer
                yield error_event(_bad_result().body())
            elif reply.error is not None:
                yield error_event(answer(asked, reply, shape.created)[1])
            else:
                for sent in events.result(reply):
                    yield sent
            yield DONE
        except ApiError as exc:  # the request timed out mid-stream (and was cancelled)
            answered = True
            yield error_event(exc.body())
            yield DONE
        finally:
            self.replies.close(request_id)
            place.release()
            if not answered:  # the client went away: stop the work it asked for
                self.cancel_later(request_id, "client_disconnected")

    async def _next(self, queue: asyncio.Queue[Reply], deadline: float, request_id: str) -> Reply:
        try:
            return await asyncio.wait_for(queue.get(), max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            log.info("gateway_request_timed_out", request_id=request_id)
            await self.replies.cancel(request_id, "gateway_timeout")
            raise timed_out(self.settings.request_timeout) from None

    def cancel_later(self, request_id: str, reason: str) -> None:
        """Send a cancel from a task of its own: the caller may itself be cancelled."""
        task = asyncio.get_running_loop().create_task(self.replies.cancel(request_id, reason))
        self._cancels.add(task)
        task.add_done_callback(self._cancels.discard)

    async def stop(self) -> None:
        """Wait for the cancels still being sent."""
        if self._cancels:
            await asyncio.gather(*self._cancels, return_exceptions=True)


def _tool_reader(asked: Asked, tool_format: str) -> Callable[[], ToolText] | None:
    """What reads each streamed choice for tool calls: a forced call's JSON (`CallText`), or
    under "auto" text and calls in the model's format (`tool_parsing.stream_for`); None when
    the request gave no tools."""
    if not asked.tool_call:
        return None
    asked_as = asked.request.metadata.get(TOOLS_KEY, "required")
    if asked_as.startswith("required"):
        return CallText
    return functools.partial(stream_for, asked_as, tool_format)


class Place:
    """One of `--max-inflight` places, held from `Gateway.admit` until `release` (which
    releases once, however often it is called)."""

    def __init__(self, gateway: Gateway) -> None:
        self._gateway: Gateway | None = gateway

    def release(self) -> None:
        if self._gateway is not None:
            self._gateway.in_flight -= 1
            self._gateway = None
