"""The gateway's Kafka side: its own reply topic, requests out, results and chunks back.

Correlation: each gateway instance creates a reply topic of its own at start
(`tokenmill.gateway.<instance>.results`, which the workers' default `--allowed-reply-to`
`*.results` accepts) and sends every request with `reply_to` set to it. One consumer reads
that topic and hands each result or chunk to the waiting HTTP handler by request id (`open`
returns its queue). Instances behind one load balancer never see each other's answers, since
each reads only its own topic. A result whose client has gone (timed out, disconnected) finds
no queue: it is dropped and counted (`dropped`). At a clean stop the topic is deleted; one
left by a killed gateway holds nothing anyone waits for (delete it, or let retention empty it).
"""

from __future__ import annotations

import asyncio
import contextlib

import msgspec
import structlog
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError
from aiokafka.structs import ConsumerRecord, TopicPartition

from actors.ingest.reply_topics import MIN_REFRESH_S
from actors.kafka import record_reader
from actors.kafka.connection import KafkaConnection
from actors.telemetry.trace_context import TraceContext
from messages import headers as h
from messages.cancel import CANCEL_SCHEMA, CancelRequest, cancel_codec
from messages.chunk import GenerateChunk
from messages.codec import JSON, Codec, normalize_content_type
from messages.embedding import EmbedRequest, EmbedResult
from messages.errors import MessageError
from messages.request import GenerateRequest
from messages.request_kinds import Request
from messages.result import GenerateResult
from ops.connection.check import started_producer
from ops.errors import TopicCreateError
from ops.gateway.errors import GatewayStartError, broker_unavailable
from ops.services.topics import create_topics

log = structlog.get_logger("tokenmill.gateway")

Reply = GenerateResult | GenerateChunk | EmbedResult
_request_codec = Codec(GenerateRequest)
_embed_request_codec = Codec(EmbedRequest)
_result_codec = Codec(GenerateResult)
_chunk_codec = Codec(GenerateChunk)
_embed_result_codec = Codec(EmbedResult)
_JSON_HEADER = (h.CONTENT_TYPE, JSON.encode())
_EMBED_HEADER = (h.SCHEMA, h.EMBED_REQUEST_SCHEMA.encode())
_CANCEL_HEADERS = [(h.CONTENT_TYPE, JSON.encode()), (h.SCHEMA, CANCEL_SCHEMA.encode())]
_WORKERS_SEE_NEW_TOPICS_S = MIN_REFRESH_S + 0.5  # every worker has asked again since
_SEND_TIMEOUT_S = 15.0  # a broker that acknowledges nothing this long is unreachable: 503


class Replies:
    """Send requests and cancels; route each reply on the reply topic to its request's queue."""

    def __init__(
        self,
        kafka: KafkaConnection,
        *,
        requests_topic: str,
        cancel_topic: str,
        reply_topic: str,
        reply_partitions: int = 3,
        batch_reply_topic: str | None = None,
    ) -> None:
        self.kafka = kafka
        self.requests_topic = requests_topic
        self.cancel_topic = cancel_topic
        self.reply_topic = reply_topic
        self.reply_partitions = reply_partitions
        self.batch_reply_topic = batch_reply_topic  # the batches' results (`BatchRunner`)
        self.dropped = 0  # results that arrived for no waiting request
        self._waiting: dict[str, asyncio.Queue[Reply]] = {}
        self._producer: AIOKafkaProducer | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._reader: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Create the reply topic, start the producer and the reader (from the topic's end)."""
        # No linger: a lone request would wait the whole linger for company (5 ms of the
        # gateway's added latency at one in flight). Under load, records still share batches:
        # they gather while the partition's previous produce is in flight.
        self._producer = await started_producer(self.kafka, GatewayStartError, linger_ms=0)
        try:
            created = []
            for topic in self.topics:
                created += await create_topics(
                    self.kafka,
                    requests_partitions=self.reply_partitions,
                    names={"results": topic},
                )
        except TopicCreateError as exc:
            raise GatewayStartError(str(exc)) from exc
        if created:
            # A worker refuses a reply_to it does not know (`reply_to_refused`, answered on
            # its default results topic, where this gateway never looks) and asks the broker
            # again at most every `MIN_REFRESH_S` (`actors.ingest.reply_topics`): a request
            # sent sooner could be refused by a worker that looked just before the creation.
            await asyncio.sleep(_WORKERS_SEE_NEW_TOPICS_S)
        record_reader.install()  # a foreign record on the topic cannot stop the read
        consumer = AIOKafkaConsumer(
            **self.kafka.client_kwargs(), enable_auto_commit=False, isolation_level="read_committed"
        )
        await consumer.start()
        self._consumer = consumer
        partitions = await self._producer.partitions_for(self.reply_topic)
        tps = [TopicPartition(self.reply_topic, p) for p in sorted(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_end(*tps)
        for tp in tps:  # resolve now: a result must not slip past a lazy position
            await consumer.position(tp)
        self._reader = asyncio.create_task(self._read(consumer), name="gateway-replies")
        log.info("gateway_reply_topic_ready", topic=self.reply_topic, partitions=len(tps))

    async def stop(self, *, delete_topic: bool = True) -> None:
        """Stop reading, close the clients, delete the reply topic (a clean stop)."""
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        if self._consumer is not None:
            await self._consumer.stop()
        if self._producer is not None:
            await self._producer.stop()
        if delete_topic:
            await self._delete_topic()

    @property
    def topics(self) -> list[str]:
        """The topics this instance creates at start and deletes at a clean stop."""
        return [t for t in (self.reply_topic, self.batch_reply_topic) if t]

    def open(self, request_id: str) -> asyncio.Queue[Reply]:
        """The queue that will receive `request_id`'s chunks and result (before sending)."""
        queue: asyncio.Queue[Reply] = asyncio.Queue()
        self._waiting[request_id] = queue
        return queue

    def close(self, request_id: str) -> None:
        """No one waits for `request_id` any more: a late result is dropped and counted."""
        self._waiting.pop(request_id, None)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    async def send(self, request: Request, trace_headers: list[tuple[str, bytes]]) -> None:
        """Produce `request` (its `reply_to` set to this instance's topic) and wait for the
        broker's ack; `ApiError` 503 when the broker does not acknowledge it."""
        assert self._producer is not None, "start() first"
        request.reply_to = self.reply_topic
        value, headers = encode_request(request)
        try:
            async with asyncio.timeout(_SEND_TIMEOUT_S):
                await self._producer.send_and_wait(
                    self.requests_topic,
                    value=value,
                    key=request.id.encode(),
                    headers=headers + trace_headers,
                )
        except (KafkaError, TimeoutError) as exc:
            raise broker_unavailable(type(exc).__name__) from exc

    async def cancel(self, request_id: str, reason: str) -> None:
        """Produce a cancel record; a failure is logged, not raised (the answer is already
        an error, or the client gone)."""
        assert self._producer is not None, "start() first"
        try:
            async with asyncio.timeout(_SEND_TIMEOUT_S):
                await self._producer.send_and_wait(
                    self.cancel_topic,
                    value=cancel_codec.encode(CancelRequest(id=request_id, reason=reason)),
                    key=request_id.encode(),
                    headers=_CANCEL_HEADERS,
                )
        except (KafkaError, TimeoutError) as exc:
            log.warning("gateway_cancel_not_sent", request_id=request_id, error=repr(exc))
            return
        log.info("gateway_cancel_sent", request_id=request_id, reason=reason)

    async def _read(self, consumer: AIOKafkaConsumer) -> None:
        while True:
            fetched = await consumer.getmany(timeout_ms=1000)
            for records in fetched.values():
                for record in records:
                    self._route(record)

    def _route(self, record: ConsumerRecord[bytes, bytes]) -> None:
        reply = decode_reply(record)
        if reply is None:
            return
        queue = self._waiting.get(reply.id)
        if queue is not None:
            queue.put_nowait(reply)
        elif not isinstance(reply, GenerateChunk):
            self.dropped += 1
            log.info("gateway_result_dropped", request_id=reply.id, reason="client_gone")

    async def _delete_topic(self) -> None:
        admin = AIOKafkaAdminClient(**self.kafka.client_kwargs(), request_timeout_ms=10_000)
        try:
            await admin.start()
            await admin.delete_topics(self.topics, timeout_ms=10_000)
            log.info("gateway_reply_topic_deleted", topics=self.topics)
        except (KafkaError, TimeoutError) as exc:
            log.warning("gateway_reply_topic_not_deleted", topics=self.topics, error=repr(exc))
        finally:
            await admin.close()


def encode_request(request: Request) -> tuple[bytes, list[tuple[str, bytes]]]:
    """A request's record value (JSON) and headers: an `EmbedRequest` says what it is in the
    schema header (`EmbedRequest/1`); a `GenerateRequest` goes as producers have always sent
    it."""
    if isinstance(request, EmbedRequest):
        return _embed_request_codec.encode(request), [_JSON_HEADER, _EMBED_HEADER]
    return _request_codec.encode(request), [_JSON_HEADER]


class _Shape(msgspec.Struct):
    """What tells a result without a schema header apart: an `EmbedResult` has `data` (left
    unread; empty: not there)."""

    data: msgspec.Raw = msgspec.Raw()


_shape_codec = Codec(_Shape)


def decode_reply(record: ConsumerRecord[bytes, bytes]) -> Reply | None:
    """A result, a chunk or an embedding result, by its schema header (none: a result, of
    the kind its shape says: `data` makes an `EmbedResult`); None for anything else."""
    schema = h.header(record.headers, h.SCHEMA)
    codec: Codec[GenerateResult] | Codec[GenerateChunk] | Codec[EmbedResult]
    if schema == h.RESULT_SCHEMA.encode():
        codec = _result_codec
    elif schema == h.CHUNK_SCHEMA.encode():
        codec = _chunk_codec
    elif schema == h.EMBED_RESULT_SCHEMA.encode():
        codec = _embed_result_codec
    elif schema is not None:
        return None
    else:
        codec = _result_codec
    try:
        ctype = normalize_content_type(h.header(record.headers, h.CONTENT_TYPE))
        value = record.value or b""
        if schema is None and len(_shape_codec.decode(value, ctype).data):
            codec = _embed_result_codec
        return codec.decode(value, ctype)
    except (msgspec.DecodeError, MessageError, RecursionError):
        return None


def trace_headers(traceparent: str | None, tracestate: str | None) -> list[tuple[str, bytes]]:
    """An incoming W3C trace context, as record headers, when it is well formed (the rules
    and size limits the workers read it with: `actors.telemetry.trace_context`)."""
    given = [(h.TRACEPARENT, traceparent.strip().encode())] if traceparent else []
    if given and tracestate:
        given.append((h.TRACESTATE, tracestate.encode()))
    trace = TraceContext.of(given)
    return list(trace.headers) if trace.parent is not None else []
