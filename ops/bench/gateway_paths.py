"""`bench gateway`'s four paths: the calls its closed loops make, plain and streamed.

direct          the load client produces the request to the worker's requests topic and
                waits for its result.
gateway         `POST /v1/completions` with the same body, over a keep-alive HTTP/1.1 lane.

The streamed ones: the same request with `stream: true`, timed to its first text besides its
end (`StreamCalls`).

direct-stream   the load client produces the request (`stream=True`) and reads its reply
                topic: the first `GenerateChunk` with text, then the `GenerateResult`.
gateway-stream  `POST /v1/completions` with `"stream": true`: the first body bytes (the SSE
                event of the first text: a completion stream sends nothing before it), then
                the end of the body (after `data: [DONE]`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from actors.kafka.connection import KafkaConnection
from messages.chunk import GenerateChunk
from messages.codec import Codec
from messages.headers import CHUNK_SCHEMA, SCHEMA
from messages.openai_batch import COMPLETIONS_URL
from messages.request import GenerateRequest
from messages.result import GenerateResult
from ops.bench.gateway_process import HttpLane, http_lanes
from ops.bench.load import LoadClient, Stamp
from ops.gateway.bodies import to_asked

PLAIN, STREAMED = ("direct", "gateway"), ("direct-stream", "gateway-stream")
PATHS = PLAIN + STREAMED
Call = Callable[[int, int], Awaitable[bool]]  # (lane, request index) → answered well
_chunks, _results = Codec(GenerateChunk), Codec(GenerateResult)


class StreamLoadClient(LoadClient):
    """The load client, reading streamed requests' chunks besides their results: `first_text`
    holds when the first chunk with text of each id was fetched (perf_counter seconds)."""

    def __init__(self, kafka: KafkaConnection, topics: dict[str, str]) -> None:
        super().__init__(kafka, topics)
        self.first_text: dict[str, float] = {}

    async def __aenter__(self) -> StreamLoadClient:
        await super().__aenter__()
        return self

    def _take(self, record: Any, at: Stamp) -> None:
        """A chunk marks its id's first text; a result is taken as the load client takes it."""
        if dict(record.headers or ()).get(SCHEMA) == CHUNK_SCHEMA.encode():
            chunk = _chunks.decode(record.value or b"")
            if chunk.text and chunk.id not in self.first_text:
                self.first_text[chunk.id] = at.mono
            return
        super()._take(record, at)


class StreamCalls:
    """Closed-loop calls (`ops.bench.gateway.Call`) of one streamed run; each call keeps its
    request's time to first text (ms) in `first_ms`, None where it was not answered well."""

    def __init__(self, count: int, within_s: float) -> None:
        self.first_ms: list[float | None] = [None] * count
        self.within_s = within_s

    def direct(self, client: StreamLoadClient, batch: Sequence[GenerateRequest]) -> Call:
        async def call(_lane: int, i: int) -> bool:
            rid, start = batch[i].id, time.perf_counter()
            await (await client.send(batch[i]))
            if await client.missing([rid], self.within_s) or not client.arrived[rid].result.ok:
                return False
            if (first := client.first_text.get(rid)) is not None:
                self.first_ms[i] = (first - start) * 1e3
            return True

        return call

    def gateway(self, lanes: Sequence[HttpLane], payloads: Sequence[bytes]) -> Call:
        async def call(lane: int, i: int) -> bool:
            start = time.perf_counter()
            if await lanes[lane].post(COMPLETIONS_URL, payloads[i]) != 200:
                return False
            if (first := lanes[lane].first_data_at) is not None:
                self.first_ms[i] = (first - start) * 1e3
            return True

        return call


def body(prompt: list[int], max_tokens: int) -> dict[str, Any]:
    return {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}


def direct_requests(
    bodies: Sequence[dict[str, Any]], at: int, count: int, tag: str, reply_to: str | None = None
) -> list[GenerateRequest]:
    """Requests at..at+count-1 as the gateway maps them (streamed when `reply_to` is given)."""
    out = []
    for i in range(count):
        given = bodies[at + i] | ({"stream": True} if reply_to else {})
        request = to_asked(COMPLETIONS_URL, given, f"{tag}-{at + i}").request
        request.reply_to = reply_to
        out.append(request)
    return out


def direct_call(client: LoadClient, batch: Sequence[GenerateRequest], within_s: float) -> Call:
    """Produce request i (acked, as the gateway waits for its ack too) and wait for its result."""

    async def call(_lane: int, i: int) -> bool:
        rid = batch[i].id
        await (await client.send(batch[i]))
        return not await client.missing([rid], within_s) and client.arrived[rid].result.ok

    return call


def gateway_call(lanes: Sequence[HttpLane], payloads: Sequence[bytes]) -> Call:
    async def call(lane: int, i: int) -> bool:
        return await lanes[lane].post(COMPLETIONS_URL, payloads[i]) == 200

    return call


@dataclass
class PathCalls:
    """One run's calls on a path: `async with path_calls(path, at, count, tag) as (call,
    streamed)`, `streamed` keeping a streamed path's times to first text (else None)."""

    bodies: Sequence[dict[str, Any]]
    client: LoadClient
    streams: StreamLoadClient
    replies: str  # the streamed direct requests' reply topic (read by `streams`)
    port: int  # the gateway's
    concurrency: int
    within_s: float  # each result's wait

    @contextlib.asynccontextmanager
    async def __call__(
        self, path: str, at: int, count: int, tag: str
    ) -> AsyncIterator[tuple[Call, StreamCalls | None]]:
        if path == "direct":
            batch = direct_requests(self.bodies, at, count, tag)
            yield direct_call(self.client, batch, self.within_s), None
            return
        streamed = StreamCalls(count, self.within_s)
        if path == "direct-stream":
            batch = direct_requests(self.bodies, at, count, tag, self.replies)
            yield streamed.direct(self.streams, batch), streamed
            return
        extra = {"stream": True} if path == "gateway-stream" else {}
        payloads = [msgspec.json.encode(b | extra) for b in self.bodies[at : at + count]]
        async with http_lanes(self.port, self.concurrency) as lanes:  # before it is timed
            if extra:
                yield streamed.gateway(lanes, payloads), streamed
            else:
                yield gateway_call(lanes, payloads), None
