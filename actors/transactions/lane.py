"""One input partition's transactions: its results, dead letters, retries and consumed offset,
committed together by a producer whose transactional id names the partition.

    lane = Lane(tp, producer, config, hooks)
    await lane.open()                         # init_transactions: the last owner is fenced
    lane.start(offset, guard_metadata, answered)   # the commit the ingest read after that
    lane.add(pending); lane.wake()            # outcomes, after each batch of completions
    ok = await lane.commit(offset, metadata)  # the ingest's progress (False: fenced)
    await lane.commit(..., release=True)      # a hand-off: the last transaction, then close

A transaction holds every outcome waiting (those whose records would not fit the commit's
metadata wait for the commit point to catch up), then the consumed offset: the commit point
the ingest last asked for, with the crash guard's metadata and the offsets answered above it
(`actors.transactions.answered`). Only once it commits are the outcomes reported delivered.

An outcome whose offset is answered already (below the commit point, or in the answered set)
is not produced again: a record read twice (by a zombie and its successor, or by this worker
across a rebalance) is answered once. That check, against the state the last committed
transaction wrote, is what makes results exactly-once; the fencing keeps two owners from
both writing it.

Failures:
- fenced (the partition's new owner opened its own producer), a producer in a fatal state, or
  a transaction not ended within the transaction and delivery timeouts: the lane dies. Its
  outcomes are dropped (the owner answers their records again), commit requests answer False,
  it never opens the producer again (that would fence the owner), and it reports itself lost
  (an ingest still holding the partition rejoins the group);
- a record the broker refuses for good: the transaction is aborted, the record made what it
  is next time (`actors.transactions.refusals`) and the transaction made again; a dead letter
  refused even trimmed waits (`blocked`), retried every few seconds, holding its offset back;
- anything else (the broker away, a timeout): aborted, and made again after a backoff.

An outcome with a record for a topic this lane's producer does not know (a reply topic deleted
after its request was admitted, say) is kept out of the transactions while the topic is
awaited, at most `--topic-metadata-wait-ms` (`actors.emit.destinations`): aiokafka's `send`
would wait for it inside the open transaction, holding every outcome of the partition. A topic
the broker says is not there is a refusal (the result answered instead, `reply_to_refused`);
a broker that did not answer makes it wait again.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, cast

import structlog
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from aiokafka.structs import OffsetAndMetadata, TopicPartition

from actors.config import WorkerConfig
from actors.emit.destinations import TopicWaits
from actors.emit.planning import OutcomePlanner
from actors.emit.records import Pending, send
from actors.emit.vanished import VanishWatch
from actors.send_errors import backoff_s
from actors.transactions.answered import AnsweredOffsets, join, take
from actors.transactions.producer_close import close_within
from actors.transactions.refusals import FENCED, Failure, failed, rework

log = structlog.get_logger("tokenmill.transactions")


class LaneFenced(Exception):
    """The lane's producer was fenced (or broke for good): the partition is not ours."""


@dataclass
class LaneHooks:
    """What a lane tells the emitter about each outcome it settles."""

    delivered: Callable[[Pending], Awaitable[None]]  # produced, committed
    suppressed: Callable[[Pending], Awaitable[None]]  # answered already: not produced again
    dropped: Callable[[Pending], Awaitable[None]]  # not answered here: the owner answers it
    blocked: Callable[[Pending], Awaitable[None]]  # its dead letter waits for the DLQ
    waiting: Callable[[Pending], Awaitable[None]]  # its reply topic is awaited
    count: Callable[[str], None]  # retried sends, aborted transactions...
    lost: Callable[[TopicPartition, str], Awaitable[None]]  # died, not handed off


@dataclass
class _Request:
    offset: int
    metadata: str
    release: bool
    done: asyncio.Future[bool]


class Lane:
    BLOCKED_RETRY_S = 5.0

    def __init__(
        self,
        tp: TopicPartition,
        producer: AIOKafkaProducer,
        config: WorkerConfig,
        planner: OutcomePlanner,
        hooks: LaneHooks,
    ) -> None:
        self.tp = tp
        self.producer = producer
        self.config = config
        self.planner = planner
        self.hooks = hooks
        self.base: int | None = None  # the commit point last written (or asked for)
        self.guard_metadata = ""
        self.answered = AnsweredOffsets()  # committed answers at or past `base`
        self.waiting: dict[int, list[Pending]] = {}  # by offset: the first is produced
        self.blocked_until: dict[int, float] = {}  # offsets whose dead letter waits
        self.topics = TopicWaits(producer, config.topic_metadata_wait_ms / 1000)
        self.awaiting: dict[int, asyncio.Task[None]] = {}  # offsets whose topics are awaited
        self.vanished = VanishWatch(producer, count=hooks.count)  # topics deleted meanwhile
        self.requests: list[_Request] = []
        self.dead = False
        self.closed = asyncio.Event()
        self.progressed = asyncio.Event()  # set after each transaction, and at the lane's end
        self.transactions = 0  # committed
        self._wakeup = asyncio.Event()
        self._dirty = False  # the commit point or its metadata changed since the last commit
        self._releasing = False  # a release was asked for: close after its transaction
        # What waits does not fit the commit's metadata: nothing goes until the commit point
        # moves (a commit request) and makes room.
        self._full = False

    # -- life ---------------------------------------------------------------------------------

    async def open(self) -> None:
        """Start the producer and wait for its producer id: the broker has then fenced every
        earlier producer of this transactional id and ended its open transaction."""
        await self.producer.start()
        # aiokafka asks for the id in its sender loop; its transaction manager says when
        # it has one (there is no public wait for it).
        manager = cast(Any, self.producer)._txn_manager
        await manager.wait_for_pid()

    def start(self, offset: int | None, guard_metadata: str, answered: AnsweredOffsets) -> None:
        """Where the partition's commits stand after `open()`: outcomes below `offset` or in
        `answered` are answered already."""
        self.base, self.guard_metadata = offset, guard_metadata
        self.answered = answered.copy()
        if offset is not None:
            self.answered.prune_below(offset)
        self.wake()

    def add(self, p: Pending) -> None:
        """An outcome for the next transaction (not sent until `wake()`)."""
        if self.dead:
            raise LaneFenced(str(self.tp))
        self.waiting.setdefault(p.outcome.record.offset, []).append(p)

    def wake(self) -> None:
        self._wakeup.set()

    @property
    def releasing(self) -> bool:
        """A release was asked for: the lane closes after its transaction."""
        return self._releasing or any(r.release for r in self.requests)

    async def commit(self, offset: int, metadata: str, *, release: bool = False) -> bool:
        """Commit `offset` (the ingest's commit point) with its crash-guard `metadata` in the
        next transaction; True once committed, False when the lane is fenced. `release`: the
        partition is given up, the lane closes after that transaction."""
        if self.dead:
            return False
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self.requests.append(_Request(offset, metadata, release, done))
        self.wake()
        return await done

    async def run(self) -> None:
        """Transactions until released or fenced; then the producer is closed."""
        try:
            attempt = 0
            while not self.dead:
                await self._wait_for_work()
                if self.dead:
                    break
                try:
                    await self._transaction()
                    self.progressed.set()
                    attempt = 0
                except LaneFenced as exc:
                    await self._die(exc)
                except _Again:
                    continue  # refused records were answered instead: make it again now
                except Exception as exc:  # the broker's, or a bug: retried, never silent
                    if not isinstance(exc, KafkaError):
                        log.exception("transaction_failed", topic=self.tp.topic,
                                      partition=self.tp.partition)  # fmt: skip
                    delay = backoff_s(attempt)
                    attempt += 1
                    self.hooks.count("transaction_retried")
                    log.warning("transaction_retrying", topic=self.tp.topic,
                                partition=self.tp.partition, error=repr(exc),
                                retry_in_s=round(delay, 2))  # fmt: skip
                    await asyncio.sleep(delay)
        finally:
            await self._close()

    async def stop(self) -> None:
        """Drop what waits and close: the records are answered by whoever reads them next."""
        await self._die(None)

    # -- a transaction ------------------------------------------------------------------------

    async def _wait_for_work(self) -> None:
        interval = self.config.transaction_interval_ms / 1000
        while True:
            ready = self._ready_offsets()
            if self.requests or (ready and self.base is not None and not self._full) or self.dead:
                return
            timeout = interval
            if self.blocked_until and not ready:
                timeout = max(0.0, min(self.blocked_until.values()) - time.monotonic())
            self._wakeup.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), timeout if self.waiting else None)

    def _ready_offsets(self) -> list[int]:
        now = time.monotonic()
        return sorted(
            offset
            for offset in self.waiting
            if self.blocked_until.get(offset, 0.0) <= now and offset not in self.awaiting
        )

    async def _transaction(self) -> None:
        """One transaction: the waiting outcomes that fit, then the offset; reports on commit."""
        requests, self.requests = self.requests, []
        if requests:
            self._full = False  # the commit point may move: room again
        try:
            for request in requests:
                if self.base is None or request.offset >= self.base:
                    self.base = request.offset
                self.guard_metadata = request.metadata
                self._dirty = True
                self._releasing |= request.release
            await self._suppress_answered()
            self._await_unknown_topics()
            batch, answered = self._batch()
            if batch or self._dirty:
                await self._write(batch, answered)
                self.transactions += 1
        except BaseException:
            self.requests[:0] = [r for r in requests if not r.done.done()]
            raise
        self.answered = answered
        self._dirty = False
        for offset in batch:
            first, *copies = self.waiting.pop(offset)
            await self.hooks.delivered(first)
            for copy in copies:
                await self.hooks.suppressed(copy)
        for request in requests:
            request.done.set_result(True)
        if self._releasing:  # handed off: what still waits is answered by the next owner
            await self._die(None)

    async def _suppress_answered(self) -> None:
        """Outcomes of offsets answered already: reported, never produced again."""
        base = self.base
        done = [o for o in self.waiting if (base is not None and o < base) or o in self.answered]
        for offset in done:
            for p in self.waiting.pop(offset):
                self.hooks.count("duplicate_suppressed")
                log.info("duplicate_suppressed", topic=self.tp.topic,
                         partition=self.tp.partition, offset=offset)  # fmt: skip
                await self.hooks.suppressed(p)
            self.blocked_until.pop(offset, None)

    def _await_unknown_topics(self) -> None:
        """Set apart the ready outcomes with a record for a topic the producer does not know."""
        for offset in self._ready_offsets():
            p = self.waiting[offset][0]
            if not p.records:
                self.planner.plan(p, self.config)
            if topics := {r.topic for r in p.records if not self.topics.known(r.topic)}:
                self.awaiting[offset] = asyncio.create_task(self._await_topics(offset, p, topics))

    async def _await_topics(self, offset: int, p: Pending, topics: set[str]) -> None:
        """Wait for `topics` apart; a failed wait is what a refused send would be."""
        try:
            await self.hooks.waiting(p)
            ordered = sorted(topics)
            waits = await asyncio.gather(*(self.topics.ready(topic) for topic in ordered))
            failures = dict(zip(ordered, waits, strict=True))
            refused: list[Failure] = [
                (p, i, failure)
                for i, record in enumerate(p.records)
                if (failure := failures.get(record.topic)) is not None
            ]
            if refused and not self.dead and self.waiting.get(offset, [None])[0] is p:
                await self._answer_failures(refused)
        finally:
            self.awaiting.pop(offset, None)
            self.wake()

    def _batch(self) -> tuple[list[int], AnsweredOffsets]:
        """The waiting offsets this transaction takes and the answered set it writes
        (`answered.take`); none before the ingest's first commit point."""
        if self.base is None:
            return [], self.answered.copy()
        batch, answered, full = take(
            self._ready_offsets(), self.answered, self.guard_metadata, self.base
        )
        if full:
            self.hooks.count("metadata_full")
            self._full = True
        return batch, answered

    async def _write(self, batch: list[int], answered: AnsweredOffsets) -> None:
        """One transaction, bounded: aiokafka waits for a transaction's end without limit, and
        one the broker ended meanwhile (open past the transaction timeout while the broker was
        away, say) could hold the lane for good. Past the transaction timeout and a delivery
        timeout the lane gives the producer up (`LaneFenced`): the partition's next owner opens
        a new one, which ends whatever this one left open."""
        limit_s = (self.config.transaction_timeout_ms + self.config.delivery_timeout_ms) / 1000
        try:
            async with asyncio.timeout(limit_s) as bound:
                await self._write_unbounded(batch, answered)
        except TimeoutError:
            if bound.expired():
                raise LaneFenced(f"a transaction made no progress in {limit_s:.0f} s") from None
            raise

    async def _write_unbounded(self, batch: list[int], answered: AnsweredOffsets) -> None:
        producer = self.producer
        base = self.base
        assert base is not None
        try:
            await producer.begin_transaction()
            firsts = [self.waiting[offset][0] for offset in batch]
            for p in firsts:
                if not p.records:
                    self.planner.plan(p, self.config)
                p.acks = [
                    self.vanished.track(record.topic, await send(producer, record))
                    for record in p.records
                ]
            failures = await failed(firsts)
            if not failures:
                metadata = join(self.guard_metadata, answered, base)
                await producer.send_offsets_to_transaction(
                    {self.tp: OffsetAndMetadata(base, metadata)}, self.config.group
                )
                await producer.commit_transaction()
                return
            await self._abort()
        except FENCED as exc:
            raise LaneFenced(repr(exc)) from exc
        except KafkaError:
            if self._fatal():
                raise LaneFenced("the producer is in a fatal state") from None
            await self._abort()
            raise
        await self._answer_failures(failures)
        raise _Again("records refused")

    async def _answer_failures(self, failures: list[Failure]) -> None:
        """After an aborted transaction: what each refused record becomes next time; a dead
        letter refused even trimmed holds its offset back, retried every few seconds."""
        for p, i, failure in failures:
            if rework(p, i, failure, self.planner, self.config):
                continue
            offset = p.outcome.record.offset
            if offset not in self.blocked_until:
                await self.hooks.blocked(p)
            self.blocked_until[offset] = time.monotonic() + self.BLOCKED_RETRY_S
            log.error("dead_letter_blocked", topic=self.tp.topic, partition=self.tp.partition,
                      offset=offset, dlq=p.records[i].topic, error=repr(failure))  # fmt: skip

    async def _abort(self) -> None:
        if self._fatal():
            raise LaneFenced("the producer is in a fatal state")
        try:
            await self.producer.abort_transaction()
        except FENCED as exc:
            raise LaneFenced(repr(exc)) from exc
        except KafkaError:
            if self._fatal():
                raise LaneFenced("the producer is in a fatal state") from None
            raise
        self.hooks.count("transaction_aborted")

    def _fatal(self) -> bool:
        manager = cast(Any, self.producer)._txn_manager
        return bool(manager is not None and manager.is_fatal_error())

    # -- the end ------------------------------------------------------------------------------

    async def _die(self, exc: BaseException | None) -> None:
        lost = exc is not None and not self.dead
        if lost:
            log.warning("lane_fenced", topic=self.tp.topic, partition=self.tp.partition,
                        error=str(exc), dropped=len(self.waiting))  # fmt: skip
            self.hooks.count("lane_fenced")
        self.dead = True
        self.progressed.set()
        for task in self.awaiting.values():
            task.cancel()
        self.awaiting.clear()
        self.topics.close()
        self.vanished.close()
        for request in self.requests:
            if not request.done.done():
                request.done.set_result(False)
        self.requests.clear()
        waiting, self.waiting = self.waiting, {}
        for ps in waiting.values():
            for p in ps:
                await self.hooks.dropped(p)
        self.wake()
        if lost:  # the ingest may still hold the partition: then it rejoins the group
            await self.hooks.lost(self.tp, str(exc))

    async def _close(self) -> None:
        try:
            await close_within(self.producer, self.config.delivery_timeout_ms / 1000, self.tp)
        finally:
            self.closed.set()


class _Again(KafkaError):  # type: ignore[misc]
    """Records were refused: the transaction is made again at once."""

    retriable = True
