"""Send one signed control command and collect the events that answer it.

Workers answer on the events topic with events whose `command` field is the command's nonce.
The client reads the events topic from its current end *before* sending, so no answer can
slip past it, and it ignores every event that answers anything else.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import msgspec
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import KafkaError
from aiokafka.structs import TopicPartition

from actors.config import DEFAULT_CONTROL_TOPIC, DEFAULT_EVENTS_TOPIC
from actors.kafka import record_reader
from actors.kafka.connection import KafkaConnection, connection_of
from messages import headers as h
from messages.codec import JSON, Codec, normalize_content_type
from messages.control import Command
from messages.errors import MessageError
from messages.events import Event
from messages.signing import sign_command
from ops.connection.check import ensure_reachable
from ops.errors import OpsError

_event_codec: Codec[Event] = Codec(Event)  # type: ignore[arg-type]  # a union, not a class
_signed_encoder = msgspec.json.Encoder()
_POLL_S = 0.25


class ControlError(OpsError):
    """A control command could not be sent: no broker, or its topics are missing."""


async def send_command(
    kafka: KafkaConnection | str,
    command: Command,
    *,
    secret: str,
    control_topic: str = DEFAULT_CONTROL_TOPIC,
    events_topic: str = DEFAULT_EVENTS_TOPIC,
    wait_s: float,
    until: Callable[[list[Event]], bool] | None = None,
) -> list[Event]:
    """Sign `command` with `secret`, produce it, and return the events that answer it.

    Collects until `until(events)` is true or `wait_s` seconds after the send pass (without
    `until`: for the whole `wait_s`). Raises `ControlError` when Kafka or a topic cannot be
    reached; an unanswered command is not an error here (the list is just empty).
    """
    kafka = connection_of(kafka)
    await ensure_reachable(kafka, ControlError)
    producer = AIOKafkaProducer(**kafka.producer_kwargs(), acks="all")
    record_reader.install()  # a foreign record on the topic cannot stop the read
    consumer = AIOKafkaConsumer(
        **kafka.client_kwargs(), enable_auto_commit=False, isolation_level="read_committed"
    )
    try:
        try:
            await producer.start()
            await consumer.start()
        except KafkaError as exc:
            raise ControlError(f"cannot reach Kafka at {kafka.bootstrap_servers} ({exc})") from exc
        await _listen_from_end(producer, consumer, events_topic)
        signed = sign_command(command, secret, now=time.time())
        try:
            await producer.send_and_wait(
                control_topic,
                value=_signed_encoder.encode(signed),
                headers=[(h.CONTENT_TYPE, JSON.encode())],
            )
        except KafkaError as exc:
            raise ControlError(f"cannot send to topic {control_topic!r} ({exc!r})") from exc
        return await _collect(consumer, signed.nonce, wait_s, until)
    finally:
        await consumer.stop()
        await producer.stop()


async def _listen_from_end(
    producer: AIOKafkaProducer, consumer: AIOKafkaConsumer, topic: str
) -> None:
    try:  # waits for the topic's metadata
        partitions = await producer.partitions_for(topic)
    except KafkaError as exc:
        raise ControlError(
            f"cannot read topic {topic!r} ({exc!r}); run `tokenmill topics create`"
        ) from exc
    tps = [TopicPartition(topic, p) for p in sorted(partitions)]
    consumer.assign(tps)
    await consumer.seek_to_end(*tps)
    for tp in tps:  # resolve the positions now, not lazily after the answers arrive
        await consumer.position(tp)


async def _collect(
    consumer: AIOKafkaConsumer,
    nonce: str,
    wait_s: float,
    until: Callable[[list[Event]], bool] | None,
) -> list[Event]:
    events: list[Event] = []
    deadline = time.monotonic() + wait_s
    while (left := deadline - time.monotonic()) > 0:
        fetched = await consumer.getmany(timeout_ms=max(1, int(min(left, _POLL_S) * 1000)))
        for records in fetched.values():
            for record in records:
                event = _decode(record.value, record.headers)
                if event is not None and event.command == nonce:
                    events.append(event)
        if until is not None and until(events):
            break
    return events


def _decode(value: bytes | None, headers: h.Headers) -> Event | None:
    try:
        ctype = normalize_content_type(h.header(headers, h.CONTENT_TYPE))
        return _event_codec.decode(value or b"", ctype)
    except (msgspec.DecodeError, MessageError):
        return None  # an event kind this client does not know, or not an event
