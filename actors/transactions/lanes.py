"""The emitter's lanes with `--exactly-once`: one transactional producer per input partition
this worker owns, opened when the ingest takes the partition over, closed when it hands it off.

    failed = await lanes.take_over(partitions)   # opens them: their last owners are fenced
    lanes.start(LaneStart(...))                  # the commit the ingest read after that
    lanes.route(pending) or dropped              # an outcome to its partition's lane
    lanes.wake()                                 # after each batch of completions
    ok = await lanes.commit(offsets, release=...)
    await lanes.close()

Why a producer per input partition: aiokafka (0.14) sends no consumer-group metadata with a
transaction's offsets (KIP-447), so the broker cannot fence a zombie by its group generation.
A transactional id that names the input partition (`tokenmill.<group>.<topic>.<partition>`,
Kafka's original exactly-once design) can: the partition's next owner opens a producer with
the same id, which fences every earlier one and ends its open transaction before the owner
reads the partition's last commit. See docs/operations.md, "Exactly-once results".
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Mapping

import structlog
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from aiokafka.structs import TopicPartition

from actors.config import WorkerConfig
from actors.emit.planning import OutcomePlanner
from actors.emit.records import Pending
from actors.mail import LaneStart
from actors.transactions.lane import Lane, LaneHooks

log = structlog.get_logger("tokenmill.transactions")


def transactional_id(group: str, tp: TopicPartition) -> str:
    """The one transactional id of an input partition's results, whoever owns it."""
    return f"tokenmill.{group}.{tp.topic}.{tp.partition}"


def transactional_producer(config: WorkerConfig, tp: TopicPartition) -> AIOKafkaProducer:
    return AIOKafkaProducer(
        **config.kafka.producer_kwargs(),
        client_id=f"tokenmill-{config.worker_id}-txn-{tp.partition}",
        transactional_id=transactional_id(config.group, tp),
        transaction_timeout_ms=config.transaction_timeout_ms,
        acks="all",
        enable_idempotence=True,
        linger_ms=config.linger_ms,
        max_request_size=config.producer_max_bytes,
        request_timeout_ms=config.delivery_timeout_ms,
    )


class Lanes:
    def __init__(
        self,
        config: WorkerConfig,
        planner: OutcomePlanner,
        hooks: LaneHooks,
        *,
        make_producer: Callable[[WorkerConfig, TopicPartition], AIOKafkaProducer] | None = None,
    ) -> None:
        self.config = config
        self.planner = planner
        self.hooks = hooks
        self.make_producer = make_producer or transactional_producer
        self.lanes: dict[TopicPartition, Lane] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def transactions(self) -> int:
        return sum(lane.transactions for lane in self.lanes.values())

    async def take_over(self, partitions: Iterable[TopicPartition]) -> frozenset[TopicPartition]:
        """Open a lane for each partition (a lane it had is replaced: its outcomes move to the
        new one); the partitions whose producer could not be opened in time."""
        failed = set()
        for tp, opened in zip(
            partitions := list(partitions),
            await asyncio.gather(*(self._open(tp) for tp in partitions)),
            strict=True,
        ):
            if opened is None:
                failed.add(tp)
                continue
            old = self.lanes.get(tp)
            if old is not None:  # taken over again (a restarted ingest): same answers, new lane
                opened.waiting, old.waiting = old.waiting, {}
                await old.stop()
            self.lanes[tp] = opened
            task = asyncio.create_task(opened.run(), name=f"lane-{tp.topic}-{tp.partition}")
            self._tasks.add(task)
            task.add_done_callback(self._ended(tp, opened))
        return frozenset(failed)

    async def _open(self, tp: TopicPartition) -> Lane | None:
        lane = Lane(tp, self.make_producer(self.config, tp), self.config, self.planner, self.hooks)
        timeout_s = self.config.delivery_timeout_ms / 1000
        try:
            await asyncio.wait_for(lane.open(), timeout_s)
        except (KafkaError, TimeoutError, OSError) as exc:
            log.error("lane_open_failed", topic=tp.topic, partition=tp.partition, error=repr(exc))
            with contextlib.suppress(KafkaError):
                await lane.producer.stop()
            return None
        log.info("lane_opened", topic=tp.topic, partition=tp.partition,
                 transactional_id=transactional_id(self.config.group, tp))  # fmt: skip
        return lane

    def _ended(self, tp: TopicPartition, lane: Lane) -> Callable[[asyncio.Task[None]], None]:
        def ended(task: asyncio.Task[None]) -> None:
            self._tasks.discard(task)
            if self.lanes.get(tp) is lane:
                del self.lanes[tp]
            if not task.cancelled() and (exc := task.exception()) is not None:
                log.error("lane_crashed", topic=tp.topic, partition=tp.partition, error=repr(exc))

        return ended

    def start(self, message: LaneStart) -> None:
        lane = self.lanes.get(message.tp)
        if lane is not None:
            lane.start(message.offset, message.guard_metadata, message.answered)

    def route(self, p: Pending) -> bool:
        """Hand `p` to its partition's lane; False when this worker has none for it (the
        partition was handed off or fenced: its owner answers the record)."""
        lane = self.lanes.get(p.outcome.record.tp)
        if lane is None or lane.dead:
            return False
        lane.add(p)
        return True

    def wake(self) -> None:
        for lane in self.lanes.values():
            lane.wake()

    async def commit(
        self, offsets: Mapping[TopicPartition, tuple[int, str]], *, release: bool
    ) -> bool:
        """Each partition's offset and crash-guard metadata in its lane's next transaction;
        False when a partition has no live lane (fenced: nothing of it was written)."""
        results = await asyncio.gather(
            *(self._commit(tp, offset, meta, release) for tp, (offset, meta) in offsets.items())
        )
        return all(results)

    async def _commit(self, tp: TopicPartition, offset: int, meta: str, release: bool) -> bool:
        lane = self.lanes.get(tp)
        if lane is None:
            return False
        ok = await lane.commit(offset, meta, release=release)
        if release:
            await lane.closed.wait()
        return ok

    async def hand_off(self, partitions: Iterable[TopicPartition]) -> None:
        """The partitions were revoked: their lanes stop (a release in progress commits first;
        what still waits is dropped, answered by the next owner)."""
        for tp in partitions:
            lane = self.lanes.get(tp)
            if lane is None:
                continue
            if not lane.releasing:
                await lane.stop()
            await lane.closed.wait()

    async def close(self) -> None:
        """Every lane stopped (what waits is dropped: read again by the next owner)."""
        for lane in list(self.lanes.values()):
            await lane.stop()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def flush(self) -> None:
        """Until every lane has committed what waits in it, or died."""
        while busy := [lane for lane in self.lanes.values() if lane.waiting and not lane.dead]:
            for lane in busy:
                lane.progressed.clear()
                lane.wake()
            waits = [asyncio.ensure_future(lane.progressed.wait()) for lane in busy]
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for wait in waits:
                    wait.cancel()
