"""The cancel actor survives a cancel record the Kafka client cannot read as sent (a header key
that is not UTF-8, as librdkafka, Java and Go producers can write): counted, logged, skipped;
the cancels after it are handed on."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

from aiokafka.consumer.fetcher import READ_UNCOMMITTED, PartitionRecords
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.record.util import calc_crc32c
from aiokafka.structs import ConsumerRecord, TopicPartition
from structlog.testing import capture_logs

from actors.cancel.actor import CancelActor
from actors.config import WorkerConfig
from actors.kafka.record_reader import LenientRecords
from actors.mail import Cancel
from actors.runtime import Mailbox
from messages.cancel import CancelRequest, cancel_codec

TP = TopicPartition("lane.cancel", 0)
BAD_KEY = b"\xff\xfekey"


def _fetched(ids: list[str], bad: set[int]) -> list[ConsumerRecord[bytes, bytes]]:
    """One v2 batch of cancels, those at `bad` with a header key that is not UTF-8, read as
    aiokafka's fetcher reads a fetch response once `record_reader` is installed."""
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=0, producer_id=-1, producer_epoch=-1,
        base_sequence=-1, batch_size=1 << 20,
    )  # fmt: skip
    for i, request_id in enumerate(ids):
        key = "\x01" * len(BAD_KEY) if i in bad else "content-type"
        value = cancel_codec.encode(CancelRequest(id=request_id))
        builder.append(i, timestamp=1000 + i, key=request_id.encode(), value=value,
                       headers=[(key, b"application/json")])  # fmt: skip
    buf = bytearray(builder.build()).replace(b"\x01" * len(BAD_KEY), BAD_KEY)
    struct.pack_into(">I", buf, 17, calc_crc32c(bytes(buf[21:])))
    partition = PartitionRecords(
        TP, LenientRecords(bytes(buf)), None, 0, None, None, True, READ_UNCOMMITTED
    )
    return [_consumer_record(r) for r in partition]


def _consumer_record(r: Any) -> ConsumerRecord[bytes, bytes]:
    """What the consumer hands out for a record its fetcher read."""
    return ConsumerRecord(
        TP.topic, TP.partition, r.offset, r.timestamp, r.timestamp_type, r.key, r.value, None,
        -1, -1, r.headers,
    )  # fmt: skip


def test_a_cancel_with_a_header_key_that_is_not_utf8_is_counted_and_skipped() -> None:
    cancels: Mailbox[Cancel] = Mailbox(8)
    actor = CancelActor(WorkerConfig(cancel_topic=TP.topic), cancels)
    records = _fetched(["a", "b", "c"], bad={1})
    assert [r.offset for r in records] == [0, 1, 2]

    async def main() -> None:
        for record in records:
            await actor._handle(record)

    with capture_logs() as logs:
        asyncio.run(main())
    assert actor.refused == {"unreadable": 1} and actor.received == 2
    assert [cancels.get_nowait().request_id for _ in range(2)] == ["a", "c"]
    (event,) = [e for e in logs if e["event"] == "cancel_unreadable"]
    assert event["offset"] == 1 and event["reason"] == "unreadable"
    assert "not UTF-8" in event["detail"]
