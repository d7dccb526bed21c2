"""The gateway's Kafka side without a broker: 503 when the broker acknowledges nothing,
late results dropped and counted, trace context carried on, embedding requests and results
told apart by their schema header (or a result's shape)."""

from __future__ import annotations

from typing import Any

import pytest
from aiokafka.errors import KafkaConnectionError
from aiokafka.structs import ConsumerRecord

from actors.kafka.connection import KafkaConnection
from messages import headers as h
from messages.chunk import GenerateChunk
from messages.codec import MSGPACK, Codec
from messages.embedding import Embedding, EmbedRequest, EmbedResult
from messages.request import GenerateRequest
from messages.result import GenerateResult
from ops.gateway.errors import ApiError
from ops.gateway.replies import Replies, decode_reply, trace_headers


class AwayBroker:
    async def send_and_wait(self, *_args: Any, **_kwargs: Any) -> None:
        raise KafkaConnectionError("no broker")


def replies() -> Replies:
    return Replies(
        KafkaConnection(), requests_topic="r", cancel_topic="c", reply_topic="gw.x.results"
    )


async def test_a_broker_that_is_away_is_503() -> None:
    side = replies()
    side._producer = AwayBroker()  # type: ignore[assignment]
    with pytest.raises(ApiError) as caught:
        await side.send(GenerateRequest(id="a", prompt="x"), [])
    assert (caught.value.status, caught.value.code) == (503, "unavailable")


def record(result: GenerateResult) -> ConsumerRecord[bytes, bytes]:
    value = Codec(GenerateResult).encode(result)
    headers = [(h.SCHEMA, h.RESULT_SCHEMA.encode())]
    return ConsumerRecord("gw.x.results", 0, 0, 0, 0, b"k", value, None, 1, len(value), headers)


def raw_record(value: bytes, *headers: tuple[str, bytes]) -> ConsumerRecord[bytes, bytes]:
    return ConsumerRecord("t", 0, 0, 0, 0, b"k", value, None, 1, len(value), list(headers))


VECTORS = EmbedResult(id="e", data=[Embedding(index=0, embedding=[0.6, 0.8])], dimensions=2)


def test_an_embedding_result_is_read_by_its_header_or_its_shape() -> None:
    value = Codec(EmbedResult).encode(VECTORS)
    schema = (h.SCHEMA, h.EMBED_RESULT_SCHEMA.encode())
    assert decode_reply(raw_record(value, schema)) == VECTORS
    assert decode_reply(raw_record(value)) == VECTORS  # no header: `data` says what it is
    packed = Codec(EmbedResult).encode(VECTORS, MSGPACK)
    assert decode_reply(raw_record(packed, (h.CONTENT_TYPE, MSGPACK.encode()))) == VECTORS
    plain = GenerateResult(id="g", text="hi")
    assert decode_reply(raw_record(Codec(GenerateResult).encode(plain))) == plain
    chunk = GenerateChunk(id="g", text="h")
    chunked = raw_record(Codec(GenerateChunk).encode(chunk), (h.SCHEMA, h.CHUNK_SCHEMA.encode()))
    assert decode_reply(chunked) == chunk
    assert decode_reply(raw_record(value, (h.SCHEMA, b"Other/1"))) is None
    assert decode_reply(raw_record(b"[1, 2]", schema)) is None


def test_a_late_embedding_result_is_dropped_and_counted() -> None:
    side = replies()
    value = Codec(EmbedResult).encode(VECTORS)
    side._route(raw_record(value, (h.SCHEMA, h.EMBED_RESULT_SCHEMA.encode())))
    assert side.dropped == 1


def test_a_result_goes_to_its_waiter_and_one_for_no_one_is_counted() -> None:
    side = replies()
    queue = side.open("mine")
    side._route(record(GenerateResult(id="mine", text="hi")))
    assert queue.get_nowait().id == "mine"
    side.close("mine")
    side._route(record(GenerateResult(id="mine", text="late")))
    assert side.dropped == 1


class Recording:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, list[tuple[str, bytes]]]] = []

    async def send_and_wait(
        self, topic: str, *, value: bytes, key: bytes, headers: list[tuple[str, bytes]]
    ) -> None:
        self.sent.append((topic, value, headers))


async def test_a_request_is_sent_with_reply_to_its_instance_s_topic() -> None:
    side, producer = replies(), Recording()
    side._producer = producer  # type: ignore[assignment]
    trace = trace_headers("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", None)
    await side.send(GenerateRequest(id="a", prompt="x"), trace)
    [(topic, value, headers)] = producer.sent
    assert topic == "r"
    assert Codec(GenerateRequest).decode(value).reply_to == "gw.x.results"
    assert trace[0] in headers


async def test_an_embedding_request_says_what_it_is_in_its_schema_header() -> None:
    side, producer = replies(), Recording()
    side._producer = producer  # type: ignore[assignment]
    await side.send(EmbedRequest(id="e", input=["a", "b"]), [])
    await side.send(GenerateRequest(id="g", prompt="x"), [])
    [(_, embed_value, embed_headers), (_, _, plain_headers)] = producer.sent
    sent = Codec(EmbedRequest).decode(embed_value)
    assert (sent.input, sent.reply_to) == (["a", "b"], "gw.x.results")
    assert h.header(embed_headers, h.SCHEMA) == h.EMBED_REQUEST_SCHEMA.encode()
    assert h.header(plain_headers, h.SCHEMA) is None  # as producers have always sent it
    assert h.header(embed_headers, h.CONTENT_TYPE) == b"application/json"


def test_an_incoming_traceparent_is_carried_on_and_a_malformed_one_dropped() -> None:
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    assert trace_headers(parent, "k=v") == [
        (h.TRACEPARENT, parent.encode()),
        (h.TRACESTATE, b"k=v"),
    ]
    assert trace_headers("not-a-trace", None) == []
    assert trace_headers(None, "k=v") == []
