"""The emitter's lanes (`actors.transactions.lanes`): one transactional producer per input
partition taken over, its id naming the partition; outcomes routed to their partition's lane;
lanes closed at a hand-off. Fake transactional producers stand in for the broker."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, cast

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaConnectionError
from aiokafka.structs import OffsetAndMetadata, TopicPartition

from actors.config import WorkerConfig
from actors.mail import LaneStart
from actors.transactions.answered import SEPARATOR, AnsweredOffsets
from actors.transactions.lanes import Lanes, transactional_id, transactional_producer
from tests.unit.actors.transactions.fakes import (
    REQUESTS,
    FakeTransactionalProducer,
    RecordingHooks,
    pending,
    planner,
    worker_config,
)

TP0, TP1, TP2 = (TopicPartition(REQUESTS, n) for n in range(3))


@dataclass
class Rig:
    lanes: Lanes
    hooks: RecordingHooks
    producers: list[FakeTransactionalProducer]  # every one made, in order
    unreachable: set[TopicPartition]  # the partitions whose producers get no producer id

    def producer(self, tp: TopicPartition) -> FakeTransactionalProducer:
        """The last producer made for `tp`."""
        made = [p for p in self.producers if p.transactional_id == transactional_id("g", tp)]
        return made[-1]


@asynccontextmanager
async def running_lanes(*unreachable: TopicPartition) -> AsyncIterator[Rig]:
    hooks = RecordingHooks()
    producers: list[FakeTransactionalProducer] = []

    def make_producer(config: WorkerConfig, tp: TopicPartition) -> AIOKafkaProducer:
        producer = FakeTransactionalProducer(transactional_id(config.group, tp))
        if tp in unreachable:
            producer._txn_manager.pid_error = KafkaConnectionError("no coordinator")
        producers.append(producer)
        return cast(AIOKafkaProducer, producer)

    lanes = Lanes(worker_config(), planner(), hooks.lane_hooks(), make_producer=make_producer)
    try:
        yield Rig(lanes, hooks, producers, set(unreachable))
    finally:
        await lanes.close()


def start(tp: TopicPartition, offset: int | None) -> LaneStart:
    return LaneStart(tp, offset, "guard", AnsweredOffsets())


async def test_take_over_opens_a_lane_per_partition_with_a_transactional_id_naming_it() -> None:
    async with running_lanes() as rig:
        assert await rig.lanes.take_over([TP0, TP1]) == frozenset()

        assert set(rig.lanes.lanes) == {TP0, TP1}
        assert [p.transactional_id for p in rig.producers] == [
            "tokenmill.g.lane.requests.0",
            "tokenmill.g.lane.requests.1",
        ]
        # opened: started, and its producer id waited for (every earlier owner fenced)
        assert all(p.started and p._txn_manager.pid_waited for p in rig.producers)
    assert all(p.stopped for p in rig.producers)


async def test_the_real_producer_of_a_partition_carries_its_transactional_id() -> None:
    config = worker_config()
    producer = transactional_producer(config, TopicPartition(REQUESTS, 3))
    try:
        manager = cast(Any, producer)._txn_manager
        assert manager.transactional_id == "tokenmill.g.lane.requests.3"
        assert manager.transaction_timeout_ms == config.transaction_timeout_ms
    finally:
        await producer.stop()  # never started: nothing to reach


async def test_a_partition_whose_producer_cannot_be_opened_is_reported_failed() -> None:
    async with running_lanes(TP1) as rig:
        assert await rig.lanes.take_over([TP0, TP1]) == frozenset({TP1})

        assert set(rig.lanes.lanes) == {TP0}
        assert rig.producer(TP1).stopped
        assert rig.lanes.route(pending(0, partition=1)) is False


async def test_route_refuses_an_outcome_of_a_partition_it_has_no_lane_for() -> None:
    async with running_lanes() as rig:
        await rig.lanes.take_over([TP0])

        assert rig.lanes.route(pending(0, partition=2)) is False
        assert rig.lanes.route(pending(0, partition=0)) is True


async def test_each_partition_commits_its_outcomes_and_offset_in_its_own_transaction() -> None:
    async with running_lanes() as rig:
        await rig.lanes.take_over([TP0, TP1])
        rig.lanes.start(start(TP0, None))
        rig.lanes.start(start(TP1, None))
        for p in (pending(4, partition=0), pending(7, partition=1)):
            assert rig.lanes.route(p)
        rig.lanes.wake()

        assert await rig.lanes.commit({TP0: (4, "g0"), TP1: (6, "g1")}, release=False)

        assert rig.lanes.transactions == 2
        [txn0] = rig.producer(TP0).committed()
        [txn1] = rig.producer(TP1).committed()
        assert txn0.offsets == {TP0: OffsetAndMetadata(4, f"g0{SEPARATOR}0")}
        assert txn1.offsets == {TP1: OffsetAndMetadata(6, f"g1{SEPARATOR}1")}
        assert [s.result.id for s in txn0.sent] == ["r-0-4"]
        assert [s.result.id for s in txn1.sent] == ["r-1-7"]
        assert await rig.lanes.commit({TP2: (0, "g2")}, release=False) is False  # no lane


async def test_hand_off_closes_the_lanes_and_drops_what_waits_in_them() -> None:
    async with running_lanes() as rig:
        await rig.lanes.take_over([TP0, TP1])
        rig.lanes.start(start(TP0, None))  # no commit point yet: its outcome waits
        waiting = pending(3, partition=0)
        assert rig.lanes.route(waiting)

        await rig.lanes.hand_off([TP0])

        lane0 = rig.producer(TP0)
        assert lane0.stopped and lane0.transactions == []
        assert rig.hooks.dropped == [waiting]
        assert rig.lanes.route(pending(4, partition=0)) is False
        assert not rig.producer(TP1).stopped
        assert rig.lanes.route(pending(4, partition=1)) is True


async def test_a_released_lane_commits_before_its_hand_off_completes() -> None:
    async with running_lanes() as rig:
        await rig.lanes.take_over([TP0])
        rig.lanes.start(start(TP0, None))
        delivered = pending(3, partition=0)
        rig.lanes.route(delivered)

        producer = rig.producer(TP0)
        producer.commit_gate = asyncio.Event()
        commit = asyncio.create_task(rig.lanes.commit({TP0: (3, "g0")}, release=True))
        await producer.committing.wait()  # the release's transaction is committing
        hand_off = asyncio.create_task(rig.lanes.hand_off([TP0]))
        producer.commit_gate.set()
        await hand_off
        assert await commit is True

        assert rig.hooks.delivered == [delivered] and rig.hooks.dropped == []
        [txn] = rig.producer(TP0).committed()
        assert txn.offsets == {TP0: OffsetAndMetadata(3, f"g0{SEPARATOR}0")}


async def test_taking_a_partition_over_again_moves_its_waiting_outcomes_to_the_new_lane() -> None:
    async with running_lanes() as rig:
        await rig.lanes.take_over([TP0])
        first, first_lane = rig.producer(TP0), rig.lanes.lanes[TP0]
        rig.lanes.route(waiting := pending(5, partition=0))

        await rig.lanes.take_over([TP0])  # a restarted ingest takes it over again
        rig.lanes.start(start(TP0, 5))
        await rig.hooks.settled(1)
        await first_lane.closed.wait()

        assert first.stopped and first.transactions == [] and rig.hooks.dropped == []
        assert rig.hooks.delivered == [waiting]
        [txn] = rig.producer(TP0).committed()
        assert rig.producer(TP0) is not first
        assert [s.result.id for s in txn.sent] == ["r-0-5"]
