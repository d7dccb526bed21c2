"""The emitter's exactly-once side (`actors.transactions.outcomes`): the ingest's partition
messages answered, outcomes committed in their partition's transaction and reported, those of a
partition this worker does not own dropped. Fake transactional producers stand in for the
broker."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, cast

from aiokafka import AIOKafkaProducer
from aiokafka.errors import ProducerFenced
from aiokafka.structs import TopicPartition

from actors.config import WorkerConfig
from actors.emit.chunks import ChunkLedger
from actors.emit.delivery import Delivery
from actors.emit.destinations import Destinations
from actors.emit.records import Pending
from actors.mail import CommitOffsets, Dropped, HandOff, LaneLost, LaneStart, TakeOver
from actors.transactions.answered import AnsweredOffsets
from actors.transactions.lanes import transactional_id
from actors.transactions.outcomes import Notice, Settlement, TransactionalOutcomes
from tests.unit.actors.transactions.fakes import (
    REQUESTS,
    FakeTransactionalProducer,
    pending,
    planner,
    worker_config,
)

TP0, TP1 = TopicPartition(REQUESTS, 0), TopicPartition(REQUESTS, 1)
NO_DESTINATIONS = cast(Destinations, None)  # only outcomes with chunks waiting reach for it


class Emitter:
    """What the emitter keeps of what `TransactionalOutcomes` tells it."""

    def __init__(self) -> None:
        self.reported: list[Pending] = []
        self.notices: list[Notice] = []
        self.taken: list[Pending] = []
        self.counts: Counter[str] = Counter()
        self.producers: dict[str, FakeTransactionalProducer] = {}

    async def report(self, p: Pending) -> None:
        self.reported.append(p)

    async def notify(self, notice: Notice) -> None:
        self.notices.append(notice)

    def count(self, action: str) -> None:
        self.counts[action] += 1

    def make_producer(self, config: WorkerConfig, tp: TopicPartition) -> AIOKafkaProducer:
        producer = FakeTransactionalProducer(transactional_id(config.group, tp))
        self.producers[producer.transactional_id or ""] = producer
        return cast(AIOKafkaProducer, producer)

    def outcomes(self) -> TransactionalOutcomes:
        plan = planner()
        delivery = Delivery(plan, count=self.count, chunk_confirmed=lambda: None)
        settlement = Settlement(self.report, self.notify, self.taken.append, self.count)
        return TransactionalOutcomes(
            worker_config(), plan, ChunkLedger(), delivery, settlement,
            make_producer=self.make_producer,
        )  # fmt: skip


@asynccontextmanager
async def running() -> AsyncIterator[tuple[Emitter, TransactionalOutcomes]]:
    """An emitter's recorder and its exactly-once side, whose lanes are closed on the way out."""
    emitter = Emitter()
    outcomes = emitter.outcomes()
    try:
        yield emitter, outcomes
    finally:
        await outcomes.stop()


def future() -> asyncio.Future[Any]:
    """A message's `done`, answered by `TransactionalOutcomes.handle`."""
    return asyncio.get_running_loop().create_future()


async def test_an_outcome_is_committed_with_its_offset_then_reported() -> None:
    async with running() as (emitter, outcomes):
        await outcomes.handle(TakeOver(frozenset({TP0}), taken_over := future()))
        assert taken_over.result() == frozenset()  # none failed to open
        await outcomes.handle(LaneStart(TP0, None, "guard", AnsweredOffsets()))
        p = pending(4, partition=0)

        await outcomes.route(NO_DESTINATIONS, [p.outcome])
        # The commit point as the ingest sends it: the offset the outcome answers.
        await outcomes.handle(CommitOffsets({TP0: (4, "g")}, False, committed := future()))

        assert committed.result() is True
        [report] = emitter.reported
        assert report.outcome is p.outcome and [t.outcome for t in emitter.taken] == [p.outcome]
        assert emitter.notices == []
        [txn] = emitter.producers[transactional_id("g", TP0)].committed()
        assert [s.result.id for s in txn.sent] == ["r-0-4"]


async def test_an_outcome_of_a_partition_not_taken_over_is_dropped_for_its_owner() -> None:
    async with running() as (emitter, outcomes):
        await outcomes.handle(TakeOver(frozenset({TP0}), future()))
        p = pending(2, partition=1)

        await outcomes.route(NO_DESTINATIONS, [p.outcome])

        [notice] = emitter.notices
        assert isinstance(notice, Dropped) and notice.record == p.outcome.record
        assert emitter.counts["dropped_not_owner"] == 1 and emitter.reported == []


async def test_a_fenced_lane_drops_what_it_held_then_tells_the_ingest_it_is_lost() -> None:
    async with running() as (emitter, outcomes):
        await outcomes.handle(TakeOver(frozenset({TP0}), future()))
        producer = emitter.producers[transactional_id("g", TP0)]
        producer.commit_errors = [ProducerFenced()]
        outcomes.lanes.start(LaneStart(TP0, 4, "g", AnsweredOffsets()))
        p = pending(4, partition=0)
        await outcomes.route(NO_DESTINATIONS, [p.outcome])

        await outcomes.handle(CommitOffsets({TP0: (4, "g")}, False, committed := future()))

        assert committed.result() is False
        dropped, lost = emitter.notices
        assert isinstance(dropped, Dropped) and dropped.record == p.outcome.record
        assert isinstance(lost, LaneLost) and lost.tp == TP0 and "Fenced" in lost.reason


async def test_a_hand_off_drops_what_waits_for_a_commit_and_answers_the_ingest() -> None:
    async with running() as (emitter, outcomes):
        await outcomes.handle(TakeOver(frozenset({TP0, TP1}), future()))
        p = pending(3, partition=0)
        await outcomes.route(NO_DESTINATIONS, [p.outcome])  # no LaneStart yet: it waits

        await outcomes.handle(HandOff(frozenset({TP0}), handed := future()))

        assert handed.done()
        [notice] = emitter.notices
        assert isinstance(notice, Dropped) and notice.record == p.outcome.record
        assert emitter.producers[transactional_id("g", TP0)].stopped
        assert not emitter.producers[transactional_id("g", TP1)].stopped
