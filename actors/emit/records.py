"""The records an outcome (or a streamed chunk) becomes, and how one is handed to the producer."""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from typing import Any, Literal, cast

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from actors.mail import Outcome
from actors.telemetry.tracing import RequestSpans
from messages.error_codes import ErrorCode
from messages.headers import Headers

# What a record is to its outcome: its result, its dead letter, its request for the next
# attempt (a retry: the outcome then has no result yet), or a streamed request's chunk.
RecordKind = Literal["result", "dead_letter", "retry", "chunk"]


@dataclass(frozen=True, slots=True)
class Record:
    topic: str
    value: bytes
    key: bytes | None
    headers: Headers
    kind: RecordKind

    @property
    def is_result(self) -> bool:
        return self.kind == "result"

    @property
    def is_dead_letter(self) -> bool:
        return self.kind == "dead_letter"

    @property
    def is_retry(self) -> bool:
        return self.kind == "retry"

    @property
    def size(self) -> int:
        """Bytes as the producer counts them against its `max_request_size`."""
        return int(
            DefaultRecordBatchBuilder.estimate_size_in_bytes(self.key, self.value, self.headers)
        )


@dataclass(slots=True)
class SentChunk:
    """A chunk handed to the producer, kept until its request's outcome is delivered."""

    record: Record
    ack: asyncio.Future[object] | None = None  # None: not sent yet (by this producer)
    confirmed: bool = False  # acknowledged (and counted)


@dataclass(slots=True)
class Pending:
    """One outcome on its way: its records and their acknowledgements, in the same order."""

    outcome: Outcome
    spans: RequestSpans
    records: list[Record]
    acks: list[asyncio.Future[object]]
    answered: ErrorCode | None = None  # set when its result was replaced by an error result
    key: int = 0  # its key among the unconfirmed: the outcome as received (`outcome` may change)
    chunks: list[SentChunk] = dataclasses.field(default_factory=list)  # its request's
    blocked: int | None = None  # the index of its dead letter, refused even trimmed
    refusal: BaseException | None = None  # why it was refused, when blocked
    no_retry: bool = False  # its retry record was refused: dead-lettered instead

    @property
    def retried(self) -> bool:
        """Its records are its request's next attempt (a retry), not an answer."""
        return bool(self.records) and self.records[0].is_retry


def known(producer: AIOKafkaProducer, topic: str) -> bool:
    """Whether `producer` has `topic`'s partitions, so that `send` will not wait for them."""
    # The producer's cluster metadata, read without a request (aiokafka has no public view).
    cluster = cast(Any, producer).client.cluster
    return cluster.partitions_for_topic(topic) is not None


async def send(producer: AIOKafkaProducer, record: Record) -> asyncio.Future[object]:
    """The acknowledgement of `record`; a failure to queue it comes back as a failed one."""
    try:
        ack: asyncio.Future[object] = await producer.send(
            record.topic, value=record.value, key=record.key, headers=list(record.headers)
        )
        # Its failure is read by `delivery.settle`, unless the producer is replaced first.
        ack.add_done_callback(retrieve)
        return ack
    except KafkaError as exc:
        failed: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        failed.set_exception(exc)
        return failed


def acknowledged(future: asyncio.Future[object]) -> bool:
    return future.done() and not future.cancelled() and future.exception() is None


def retrieve(future: asyncio.Future[object]) -> None:
    """Reads a settled `future`'s failure, so that asyncio does not log it as never read."""
    if not future.cancelled():
        future.exception()
