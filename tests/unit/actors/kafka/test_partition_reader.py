"""PartitionReader over a fake consumer: it starts and subscribes the consumer, passes each
rebalance to the actor's hooks (bumping the generation), sets `ready` once an assignment's
positions are resolved, and survives a fetch that raises on its records."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from aiokafka.errors import KafkaConnectionError
from aiokafka.structs import TopicPartition
from structlog.testing import capture_logs

from actors.config import WorkerConfig
from actors.kafka.partition_reader import Consumer, PartitionReader
from tests.unit.actors.kafka.fake_consumer import FakeConsumer, record

TP = TopicPartition("lane.cancel", 0)
WITHIN_S = 60  # only to catch a hang: every wait ends on an event


class Hooks:
    def __init__(self) -> None:
        self.calls: list[tuple[str, set[TopicPartition], int]] = []
        self.reader: PartitionReader | None = None

    async def assigned(self, consumer: Consumer, assigned: set[TopicPartition]) -> None:
        assert self.reader is not None
        self.calls.append(("assigned", assigned, self.reader.generation))

    async def revoked(self, consumer: Consumer, revoked: set[TopicPartition]) -> None:
        assert self.reader is not None
        self.calls.append(("revoked", revoked, self.reader.generation))


def reader_over(consumer: FakeConsumer, **kwargs: Any) -> PartitionReader:
    return PartitionReader(
        lambda: cast(Consumer, consumer),
        name="test",
        settings=WorkerConfig(),
        stopping=asyncio.Event(),
        **kwargs,
    )


async def test_records_are_read_in_order_and_each_rebalance_reaches_the_hooks() -> None:
    consumer = FakeConsumer([TP], [record(TP, i, b"x") for i in range(3)])
    hooks = Hooks()
    reader = reader_over(consumer, partitions=hooks)
    hooks.reader = reader
    async with asyncio.timeout(WITHIN_S):
        assert await reader.open(TP.topic) is consumer and not reader.joined
        seen = []
        async for r in reader.records():
            seen.append(r.offset)
            if len(seen) == 3:
                reader.stopping.set()
        assert seen == [0, 1, 2] and reader.joined
        await consumer.listener.on_partitions_revoked({TP})
        await reader.close()
    assert hooks.calls == [("assigned", {TP}, 1), ("revoked", {TP}, 2)]
    assert consumer.stopped


async def test_ready_is_set_once_the_positions_are_resolved_and_cleared_on_revocation() -> None:
    consumer = FakeConsumer([TP])
    reader = reader_over(consumer)
    counted: list[int] = []
    async with asyncio.timeout(WITHIN_S):
        await reader.open(TP.topic)
        keeping = asyncio.create_task(reader.keep_ready(counted.append))
        assert await reader.fetch() == {}  # joins the group
        await reader.ready.wait()
        assert counted == [1]
        await consumer.listener.on_partitions_revoked({TP})
        assert not reader.ready.is_set()
        keeping.cancel()


async def test_a_fetch_that_raises_on_its_records_is_tried_again_not_a_crash() -> None:
    consumer = FakeConsumer([TP], [record(TP, 5, b"x")])
    consumer.failures.append(UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"))
    reader = reader_over(consumer, failed_event="cancel_fetch_failed")
    with capture_logs() as logs:
        async with asyncio.timeout(WITHIN_S):
            await reader.open(TP.topic)
            assert await reader.fetch() is None
            fetched = await reader.fetch()
    assert fetched is not None and [r.offset for r in fetched[TP]] == [5]
    assert [e["event"] for e in logs] == ["cancel_fetch_failed"]
    assert reader.fetch_failures == 1
    assert consumer.positions == {}, "no positions kept: the consumer goes on from where it is"


async def test_after_a_failed_fetch_a_tracking_reader_resumes_where_it_had_read_to() -> None:
    other = TopicPartition(TP.topic, 1)
    consumer = FakeConsumer([TP, other])
    consumer.committed[other] = (7, "")
    consumer.failures.append(ValueError("a damaged batch"))
    reader = reader_over(consumer, resume_at={TP: 3}.get)
    async with asyncio.timeout(WITHIN_S):
        await reader.open(TP.topic)
        assert await reader.fetch() is None
    assert consumer.positions == {TP: 3, other: 7}, "from what was read, else the last commit"


async def test_a_broker_error_is_the_supervisors_to_handle() -> None:
    consumer = FakeConsumer([TP])
    consumer.failures.append(KafkaConnectionError("the broker went away"))
    reader = reader_over(consumer)
    await reader.open(TP.topic)
    with pytest.raises(KafkaConnectionError):
        await reader.fetch()


async def test_lag_counts_from_the_high_watermark_of_fetched_partitions() -> None:
    consumer = FakeConsumer([TP])
    consumer.highwaters = {TP: 10}
    reader = reader_over(consumer)
    assert reader.lag({TP: 4}) == {}, "not joined yet"
    await reader.open(TP.topic)
    await reader.fetch()
    assert reader.lag({TP: 4}) == {0: 6}
    assert reader.lag({}) == {}, "not fetched from yet"
