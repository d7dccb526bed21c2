"""The gateway's Kafka side without a broker: 503 when the broker acknowledges nothing,
late results dropped and counted, trace context carried on."""

from __future__ import annotations

from typing import Any

import pytest
from aiokafka.errors import KafkaConnectionError
from aiokafka.structs import ConsumerRecord

from actors.kafka.connection import KafkaConnection
from messages import headers as h
from messages.codec import Codec
from messages.request import GenerateRequest
from messages.result import GenerateResult
from ops.gateway.errors import ApiError
from ops.gateway.replies import Replies, trace_headers


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


def test_an_incoming_traceparent_is_carried_on_and_a_malformed_one_dropped() -> None:
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    assert trace_headers(parent, "k=v") == [
        (h.TRACEPARENT, parent.encode()),
        (h.TRACESTATE, b"k=v"),
    ]
    assert trace_headers("not-a-trace", None) == []
    assert trace_headers(None, "k=v") == []
