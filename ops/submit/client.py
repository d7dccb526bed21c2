"""A small Kafka client for producers of GenerateRequests and EmbedRequests: send, then collect
results (GenerateResults, EmbedResults) by id.

It listens on the results topic from its current end *before* sending, so it sees every
result of its own requests and none of anyone else's older ones.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from types import TracebackType

import msgspec
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import KafkaError
from aiokafka.structs import TopicPartition
from opentelemetry import trace
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from actors.kafka import record_reader
from actors.kafka.connection import KafkaConnection, connection_of
from messages.chunk import GenerateChunk
from messages.codec import JSON, Codec
from messages.embedding import EmbedRequest
from messages.request import GenerateRequest
from messages.request_kinds import Request, Result, request_kind
from ops.connection.check import started_producer
from ops.errors import SubmitError
from ops.gateway.replies import decode_reply, encode_request

_tracer = trace.get_tracer("tokenmill.client")
_propagator = TraceContextTextMapPropagator()
_request_codec = Codec(GenerateRequest)
_embed_codec = Codec(EmbedRequest)


def read_jobs(path: Path, *, embed: bool = False) -> list[Request]:
    """Parse a JSONL jobs file; a line without `id` gets one. Raises ValueError naming the line.

    A line is an `EmbedRequest` when it has `input` and none of `prompt`, `prompt_token_ids`,
    `messages` (the rule workers read header-less records by: `request_kind`), or with `embed`
    every line is; else a `GenerateRequest`."""
    requests: list[Request] = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        raw = line.encode()
        try:
            embeds = embed or request_kind(raw, JSON, None) == "embed"
            request: Request = _embed_codec.decode(raw) if embeds else _request_codec.decode(raw)
        except msgspec.DecodeError as exc:
            raise ValueError(f"{path}:{number}: {exc}") from None
        if not request.id:
            request.id = f"job-{uuid.uuid4().hex[:12]}-{number}"
        requests.append(request)
    return requests


class SubmitClient:
    def __init__(self, kafka: KafkaConnection | str, topic: str, results_topic: str) -> None:
        self.kafka = connection_of(kafka)
        self.topic = topic
        self.results_topic = results_topic
        self.missing: set[str] = set()
        self._producer: AIOKafkaProducer | None = None
        self._consumer: AIOKafkaConsumer | None = None

    async def __aenter__(self) -> SubmitClient:
        self._producer = await started_producer(self.kafka, SubmitError)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._producer is not None:
            await self._producer.stop()
        if self._consumer is not None:
            await self._consumer.stop()

    async def listen(self) -> None:
        """Start reading the results topic from its current end (before sending anything)."""
        record_reader.install()  # a foreign record on the topic cannot stop the read
        consumer = AIOKafkaConsumer(
            **self.kafka.client_kwargs(), enable_auto_commit=False, isolation_level="read_committed"
        )
        await consumer.start()
        self._consumer = consumer
        assert self._producer is not None
        try:  # waits for the topic's metadata
            partitions = await self._producer.partitions_for(self.results_topic)
        except KafkaError as exc:
            raise SubmitError(
                f"cannot read topic {self.results_topic!r} ({exc}); run `tokenmill topics create`"
            ) from exc
        tps = [TopicPartition(self.results_topic, p) for p in partitions]
        consumer.assign(tps)
        await consumer.seek_to_end(*tps)
        for tp in tps:  # resolve the positions now, not lazily after our results arrive
            await consumer.position(tp)

    async def send(self, requests: list[Request]) -> None:
        """Send `requests` and wait until the broker has acknowledged every one."""
        await asyncio.gather(*[await self.send_one(r) for r in requests])

    async def send_one(self, request: Request) -> asyncio.Future[object]:
        """Queue `request` for sending; the returned future resolves on the broker's ack. An
        `EmbedRequest` carries the `EmbedRequest/1` schema header."""
        assert self._producer is not None, "use `async with SubmitClient(...)`"
        if self._consumer is None:
            await self.listen()
        value, headers = encode_request(request)
        span = self._send_span(request) if _tracing_set_up() else None  # none: no span work
        if span is not None:
            carrier: dict[str, str] = {}
            _propagator.inject(carrier, context=trace.set_span_in_context(span))
            headers += [(key, value.encode()) for key, value in carrier.items()]
        try:
            acked: asyncio.Future[object] = await self._producer.send(
                self.topic, value=value, key=request.id.encode(), headers=headers,
            )  # fmt: skip
        except BaseException:
            if span is not None:
                span.end()
            raise
        if span is not None:
            acked.add_done_callback(lambda _: span.end())
        return acked

    def _send_span(self, request: Request) -> trace.Span:
        return _tracer.start_span(
            f"send {self.topic}",
            kind=SpanKind.PRODUCER,
            attributes={
                "messaging.system": "kafka",
                "messaging.operation.name": "send",
                "messaging.operation.type": "send",
                "messaging.destination.name": self.topic,
                "messaging.kafka.message.key": request.id,
                "tokenmill.request_id": request.id,
            },
        )

    async def poll(self, timeout_s: float) -> list[Result]:
        """The results (of generation and embedding requests) that arrived within `timeout_s`
        (anyone's: filter by id)."""
        return [r for r in await self.poll_replies(timeout_s) if not isinstance(r, GenerateChunk)]

    async def poll_replies(self, timeout_s: float) -> list[Result | GenerateChunk]:
        """The results and streamed chunks that arrived within `timeout_s` (anyone's), told
        apart by their `tokenmill-schema` header (none: a result, as from older workers)."""
        assert self._consumer is not None, "send() first"
        fetched = await self._consumer.getmany(timeout_ms=int(timeout_s * 1000))
        replies: list[Result | GenerateChunk] = []
        for records in fetched.values():
            for record in records:
                # None: a record of a kind this client does not know, or not a reply at all
                if (reply := decode_reply(record)) is not None:
                    replies.append(reply)
        return replies

    async def results(self, ids: set[str], within_s: float) -> AsyncIterator[Result]:
        """Yield the result for each id in `ids` as it arrives (first one wins), until all are
        in or `within_s` seconds pass; `missing` then holds the ids never answered."""
        assert self._consumer is not None, "send() first"
        self.missing = set(ids)
        deadline = time.monotonic() + within_s
        while self.missing and (left := deadline - time.monotonic()) > 0:
            for result in await self.poll(min(left, 1.0)):
                if result.id in self.missing:
                    self.missing.discard(result.id)
                    yield result

    async def replies(
        self, ids: set[str], within_s: float
    ) -> AsyncIterator[Result | GenerateChunk]:
        """Like `results`, but also yield each streamed chunk of those ids before their result
        (every chunk that arrives: rebuild the text with `ops.submit.assembly`)."""
        assert self._consumer is not None, "send() first"
        self.missing = set(ids)
        deadline = time.monotonic() + within_s
        while self.missing and (left := deadline - time.monotonic()) > 0:
            for reply in await self.poll_replies(min(left, 1.0)):
                if reply.id in self.missing:
                    if not isinstance(reply, GenerateChunk):
                        self.missing.discard(reply.id)
                    yield reply


def _tracing_set_up() -> bool:
    """Whether this process set up a tracer provider (`ops/telemetry.setup_tracing`)."""
    provider = trace.get_tracer_provider()
    return not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)
