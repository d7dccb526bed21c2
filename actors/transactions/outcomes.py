"""The emitter's exactly-once side: outcomes to their input partitions' transactions.

With `--exactly-once` the emitter produces no result itself. It hands each batch of outcomes
here (`route`), and the ingest's messages about partitions (`handle`):

    TakeOver      -> lanes opened (their last owners fenced); `done` gets the ones that failed
    LaneStart     -> the commit the ingest read after that: the lane may begin
    CommitOffsets -> the consumed offsets into the lanes' transactions, which commit
    HandOff       -> the lanes of revoked partitions commit what they hold, then close

An outcome goes to its partition's lane once its stream chunks are acknowledged (they precede
its result on the reply topic; chunks stay on the emitter's plain producer). One whose chunks
wait (for their topic, say) waits in a task of its own, holding none of the others. What a
lane settles comes back through `Settlement`: committed (reported delivered), answered
already (reported delivered, not produced again), dropped (the partition's owner answers it),
blocked on the DLQ, waiting for its reply topic; and a lane that died without a hand-off is
reported (`LaneLost`), so that an ingest still holding its partition rejoins the group.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiokafka import AIOKafkaProducer
from aiokafka.structs import TopicPartition

from actors.config import WorkerConfig
from actors.emit.chunks import ChunkLedger
from actors.emit.delivery import Delivery
from actors.emit.destinations import Destinations
from actors.emit.planning import OutcomePlanner
from actors.emit.records import Pending
from actors.mail import (
    CommitOffsets,
    Delivered,
    Dropped,
    HandOff,
    LaneLost,
    LaneStart,
    Outcome,
    OutcomeBlocked,
    OutcomeWaiting,
    TakeOver,
)
from actors.telemetry.tracing import start_request_spans
from actors.transactions.lane import LaneHooks
from actors.transactions.lanes import Lanes

PartitionMessage = TakeOver | LaneStart | CommitOffsets | HandOff
Notice = Delivered | OutcomeBlocked | OutcomeWaiting | Dropped | LaneLost


@dataclass(frozen=True)
class Settlement:
    """What the emitter does with an outcome the lanes settled or took."""

    report: Callable[[Pending], Awaitable[None]]  # committed: count it, tell the ingest
    notify: Callable[[Notice], Awaitable[None]]  # a notice to the ingest
    taken: Callable[[Pending], None]  # a lane holds it now: no longer the emitter's to resend
    count: Callable[[str], None]  # a send failure's action, for the metrics


class TransactionalOutcomes:
    def __init__(
        self,
        config: WorkerConfig,
        planner: OutcomePlanner,
        chunks: ChunkLedger,
        delivery: Delivery,
        settlement: Settlement,
        *,
        make_producer: Callable[[WorkerConfig, TopicPartition], AIOKafkaProducer] | None = None,
    ) -> None:
        self.config = config
        self.chunks = chunks
        self.delivery = delivery
        self.settlement = settlement
        self.duplicates_suppressed = 0  # outcomes of records answered already
        self.lanes = Lanes(
            config,
            planner,
            LaneHooks(
                delivered=settlement.report,
                suppressed=self._suppressed,
                dropped=self._dropped,
                blocked=self._blocked,
                waiting=self._waiting,
                count=settlement.count,
                lost=self._lost,
            ),
            make_producer=make_producer,
        )

    async def handle(self, message: PartitionMessage) -> None:
        """One of the ingest's messages about its partitions; answers its `done` future."""
        match message:
            case TakeOver(partitions=partitions, done=done):
                failed = await self.lanes.take_over(partitions)
                if not done.done():
                    done.set_result(failed)
            case LaneStart():
                self.lanes.start(message)
            case CommitOffsets(offsets=offsets, release=release, done=done):
                ok = await self.lanes.commit(offsets, release=release)
                if not done.done():
                    done.set_result(ok)
            case HandOff(partitions=partitions, done=handed):
                await self.lanes.hand_off(partitions)
                if not handed.done():
                    handed.set_result(None)

    async def route(self, out: Destinations, group: list[Outcome]) -> None:
        """Each of `group` to its partition's lane (after its chunks), then the lanes commit."""
        async with asyncio.TaskGroup() as waits:
            for outcome in group:
                spans = start_request_spans(outcome, group=self.config.group)
                p = Pending(outcome, spans, [], [], key=id(outcome))
                p.chunks = self.chunks.of(outcome)
                if all(sent.confirmed for sent in p.chunks):
                    await self._to_lane(p)
                else:
                    waits.create_task(self._chunks_then_lane(out, p))
            self.lanes.wake()

    async def stop(self) -> None:
        """Commit what the lanes hold, then close them (the worker's last step)."""
        await self.lanes.flush()
        await self.lanes.close()

    async def _chunks_then_lane(self, out: Destinations, p: Pending) -> None:
        for sent in p.chunks:
            await self.delivery.settle_chunk(out, sent)
        await self._to_lane(p)
        self.lanes.wake()

    async def _to_lane(self, p: Pending) -> None:
        self.settlement.taken(p)
        if not self.lanes.route(p):
            await self._dropped(p)

    async def _suppressed(self, p: Pending) -> None:
        """`p`'s record was answered already: reported delivered, not produced again."""
        self.duplicates_suppressed += 1
        p.spans.end(None)
        self.chunks.forget(p.outcome.result.id, p.chunks)
        await self.settlement.notify(Delivered(record=p.outcome.record,
                                               admitted=p.outcome.admitted,
                                               cost_tokens=p.outcome.cost_tokens))  # fmt: skip

    async def _dropped(self, p: Pending) -> None:
        """`p`'s partition is no longer this worker's: its owner answers the record."""
        p.spans.end(None)
        self.chunks.forget(p.outcome.result.id, p.chunks)
        self.settlement.count("dropped_not_owner")
        await self.settlement.notify(Dropped(record=p.outcome.record,
                                             admitted=p.outcome.admitted,
                                             cost_tokens=p.outcome.cost_tokens))  # fmt: skip

    async def _lost(self, tp: TopicPartition, reason: str) -> None:
        """A lane died without a hand-off: the ingest rejoins if it still holds `tp`."""
        await self.settlement.notify(LaneLost(tp, reason))

    async def _blocked(self, p: Pending) -> None:
        self.settlement.count("dead_letter_blocked")
        await self.settlement.notify(OutcomeBlocked(p.outcome.record))

    async def _waiting(self, p: Pending) -> None:
        """`p` waits for its reply topic: the ingest no longer counts it as running."""
        await self.settlement.notify(OutcomeWaiting(p.outcome.record))
