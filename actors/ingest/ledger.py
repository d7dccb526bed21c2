"""The ingest's ledger of its partitions: what was fetched, what is done, what is committed, and
whether the group still counts this member in. It is the ingest's `Partitions` hook on its
`PartitionReader`.

    ok = await ledger.claim(fetched, generation)   # a fetch may run: on record, not fenced
    for chunk, isolated in ledger.chunks(records): # suspects first, in isolated chunks
        ledger.track(ref)                          # each record read
        await ledger.settle(tp, last, generation)  # after an isolated chunk: committed past it
    ledger.done(ref) / ledger.block(ref); ledger.notify()   # the emitter's notices
    await ledger.commit_loop()                     # now and then
    await ledger.wait_quiet(); await ledger.commit_assigned(release=True)   # a drain's end

Rebalances: a revocation is a clean hand-off. Nothing more of the partitions runs, what is in
flight on them is waited for (bounded: `handoff_timeout_s`), then what was answered is
committed; only what is still unanswered then is answered again by the next owner.

Commits go through the `Committer` (offsets the `OffsetTracker` allows, with the `CrashGuard`'s
metadata). A rebalance commits what is done on the partitions given up, and reads the last
commits of those taken over (the crash guard's suspects).

Fencing: aiokafka learns that it was fenced only from a heartbeat or a commit, and its fetcher
hands out records of the old assignment until then. A fetch whose in-flight commit the group
refuses is dropped (`fetch_dropped_fenced`), as is every later one of that generation; they
were never tracked: the rejoin that follows reads the new assignment's positions from the last
commits, so their owners (maybe this worker) run them.

Stalls: a fetch loop stalled past a third of the session (the process stopped, the event loop
blocked, and heartbeats with it) may have outlived the session: the group may have handed its
partitions on. The last heartbeat came at most one interval (aiokafka's 3 s) before the stall,
so only a stall past session - 3 s (at least half the broker's minimum session of 6 s) can cost
the membership; past a third, this member asks the group (a commit) before it runs what it
fetched. A slow loop on a live event loop costs that one commit.

Exactly-once (`transactions`, with `--exactly-once`): the emitter writes the commits, in each
partition's transaction. An assignment first has the emitter open the partitions' lanes
(fencing their last owners), then reads their last commits and seeks to them (aiokafka may
have read them before the fencing), and hands them to the lanes; the partitions stay paused
meanwhile, so nothing of them is handed out before. Records the last commit names answered
are not run again (`answered_already`). A partition whose lane cannot be opened, or whose lane
dies while the partition is still this member's (`lane_lost`: its producer fenced or broken, a
transaction the broker ended), stops the ingest (`KafkaError`): the restart rejoins the group,
and the partition's next owner (maybe this worker) opens a new lane and answers what the dead
one dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator, Sequence

import structlog
from aiokafka.errors import KafkaError
from aiokafka.structs import TopicPartition

from actors.config import WorkerConfig
from actors.ingest.committer import Committer
from actors.ingest.crash_guard import CrashGuard
from actors.ingest.offsets import OffsetTracker
from actors.kafka.partition_reader import Consumer, Fetched, PartitionReader, Record, names
from actors.mail import LaneStart, RecordRef
from actors.transactions.answered import AnsweredOffsets
from actors.transactions.client import TransactionsClient

log = structlog.get_logger("tokenmill.ingest")

_NONE = AnsweredOffsets()


class Ledger:
    def __init__(
        self,
        config: WorkerConfig,
        reader: PartitionReader,
        transactions: TransactionsClient | None = None,
    ) -> None:
        """One per consumer: a restarted ingest holds no partition, and fetches each one from
        its last commit. Outcomes of the crashed run's records still arrive; they are no
        longer tracked (their records are read again: at-least-once, or with `transactions`
        answered once: the emitter's lanes know what was answered)."""
        self.reader = reader
        self.commit_interval_s = config.commit_interval_s
        self.handoff_timeout_s = config.handoff_timeout_s
        self.tracker = OffsetTracker()
        self.guard = CrashGuard(config.max_record_crashes)
        self.transactions = transactions
        self.committer = Committer(
            self.tracker,
            self.guard,
            headroom=config.fetch_max_records,
            write=transactions.write if transactions is not None else None,
        )
        self._unfenced: set[TopicPartition] = set()  # exactly-once: held, with no live lane
        self.fetched_to: dict[TopicPartition, int] = {}  # next offset to fetch, per partition
        self._stall_s = config.session_timeout_ms / 3000
        self._fetched_at = time.monotonic()
        self._stalled = False
        self._fenced: int | None = None  # a generation the group fenced: its fetches are dropped
        self._quiet = asyncio.Event()  # set when all in flight is delivered, or blocked
        self._delivered = asyncio.Event()  # set by every delivery

    # -- rebalance (the reader's `Partitions` hooks) ------------------------------------------

    async def assigned(self, consumer: Consumer, assigned: set[TopicPartition]) -> None:
        # Fetching restarts at the last commit: forget whatever a stale earlier assignment
        # left, so offsets are tracked afresh.
        self.tracker.revoke(assigned)
        self.committer.forget(assigned)
        if self.transactions is None:
            await self.committer.take_over(consumer, assigned)
            return
        # Nothing of them is handed out until their lanes start: aiokafka may have read their
        # commits before the fencing ended the last owner's transaction (a paused partition's
        # fetched records are not handed out, and its position stays where it was).
        consumer.pause(*assigned)
        try:
            self._unfenced |= await self.transactions.take_over(assigned)
            await self.committer.take_over(consumer, assigned)
            for tp in assigned - self._unfenced:
                if tp not in self.committer.answered:  # its commit was not read
                    self._unfenced.add(tp)
                    continue
                offset, metadata = self.committer.taken[tp]
                answered = self.committer.answered[tp]
                await self.transactions.start(LaneStart(tp, offset, metadata, answered))
                if offset is not None:
                    consumer.seek(tp, offset)
        finally:
            consumer.resume(*assigned)  # the ingest pauses them again under backpressure

    async def revoked(self, consumer: Consumer, revoked: set[TopicPartition]) -> None:
        await self._hand_off(revoked)
        await self.committer.commit(consumer, revoked, self.fetched_to, release=True)
        if self.transactions is not None:
            await self.transactions.hand_off(revoked)
            self._unfenced -= revoked
        self.tracker.revoke(revoked)
        self.committer.forget(revoked)
        for tp in revoked:
            self.fetched_to.pop(tp, None)

    async def _hand_off(self, revoked: set[TopicPartition]) -> None:
        """A clean hand-off: nothing more of `revoked` is read (the generation moved), and what
        is in flight on them is waited for, up to `handoff_timeout_s`, so that the commit that
        lets them go counts every answer given (else their next owner answers it again)."""
        deadline = time.monotonic() + self.handoff_timeout_s
        waited = self.tracker.waiting(revoked)
        while (left := self.tracker.waiting(revoked)) and (rest := deadline - time.monotonic()) > 0:
            self._delivered.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._delivered.wait(), rest)
        if waited:
            log.info("handoff_waited", partitions=names(revoked), in_flight=waited,
                     unanswered=left)  # fmt: skip

    # -- fetching ----------------------------------------------------------------------------

    def start_clock(self) -> None:
        """The fetch loop begins: stalls are counted from now."""
        self._fetched_at, self._stalled = time.monotonic(), False

    async def claim(self, fetched: Fetched, generation: int) -> bool:
        """After every poll: True when what it fetched may run, put on record as in flight
        first (crash_guard); False when there is nothing, or it must not run: the group fenced
        this member (a zombie, back from a stall)."""
        now = time.monotonic()
        # Until the next records: back from a stop, getmany first returns nothing (its
        # timeout ran out meanwhile), and the old assignment's records a moment later.
        self._stalled = self._stalled or now - self._fetched_at > self._stall_s
        self._fetched_at = now
        if self._unfenced:
            raise KafkaError(f"exactly-once: no transactional producer for {names(self._unfenced)}")
        if not fetched:
            return False
        stalled, self._stalled = self._stalled, False
        if self._fenced == generation:
            return False
        if await self.committer.fetched(
            self._consumer(),
            {tp: r[0].offset for tp, r in fetched.items()},
            {tp: r[-1].offset + 1 for tp, r in fetched.items()},
            verify=stalled,
        ):
            return True
        self._fenced = generation
        log.warning("fetch_dropped_fenced", partitions=names(fetched),
                    records=sum(len(r) for r in fetched.values()))  # fmt: skip
        return False

    def lane_lost(self, tp: TopicPartition, reason: str) -> None:
        """Exactly-once: `tp`'s lane died without a hand-off. Still assigned here, the partition
        could answer nothing more (its outcomes dropped, its commits refused): the next poll
        stops the ingest, whose restart rejoins the group."""
        consumer = self.reader.consumer
        if consumer is None or tp not in consumer.assignment():
            return  # handed off meanwhile: its new owner answers it
        log.warning("lane_lost_rejoining", topic=tp.topic, partition=tp.partition, reason=reason)
        self._unfenced.add(tp)

    def chunks(self, records: Sequence[Record]) -> Iterator[tuple[Sequence[Record], bool]]:
        """A partition's fetched records in the order they run: (chunk, isolated). Suspects
        (in flight when a worker died) come in isolated chunks, each to run with nothing else
        of its partition and be committed past (`settle`) before the next."""
        tp = TopicPartition(records[0].topic, records[0].partition)
        start = 0
        while start < len(records):
            end = self.guard.chunk_end(tp, records[start].offset)
            if end is None:
                yield records[start:], False
                return
            stop = start
            while stop < len(records) and records[stop].offset < end:
                stop += 1
            log.info("records_isolated", topic=tp.topic, partition=tp.partition,
                     first=records[start].offset, last=records[stop - 1].offset)  # fmt: skip
            yield records[start:stop], True
            start = stop

    def track(self, ref: RecordRef) -> None:
        """A record is read: in flight until its outcome is delivered."""
        if (before := self.tracker.track(ref.tp, ref.offset)) is not None:
            log.warning("offset_rewound", topic=ref.topic, partition=ref.partition,
                        offset=ref.offset, previous=before)  # fmt: skip
        self.fetched_to[ref.tp] = ref.offset + 1

    def answered_already(self, ref: RecordRef) -> bool:
        """Exactly-once: the last commit read at assignment names this record answered."""
        return ref.offset in self.committer.answered.get(ref.tp, _NONE)

    def quarantined(self, ref: RecordRef) -> int | None:
        """The deaths pinned on a record the crash guard will not let run again."""
        return self.guard.quarantined(ref.tp, ref.offset)

    async def settle(self, tp: TopicPartition, last: int, generation: int) -> None:
        """Once an isolated chunk (up to `last`) is done, commit past it: if the worker dies
        meanwhile, the chunk is what was in flight."""
        while generation == self.reader.generation and not self.reader.stopping.is_set():
            point = self.tracker.commit_point(tp)
            if point is None or point > last:
                break
            self._delivered.clear()
            await self._delivered.wait()
        if self.reader.consumer is not None and generation == self.reader.generation:
            await self.committer.commit(self.reader.consumer, [tp], self.fetched_to)

    # -- deliveries and commits --------------------------------------------------------------

    def done(self, ref: RecordRef) -> None:
        self.tracker.done(ref.tp, ref.offset)

    def block(self, ref: RecordRef) -> None:
        self.tracker.block(ref.tp, ref.offset)

    def notify(self) -> None:
        """After a round of notices: wake whoever waits on deliveries."""
        self._delivered.set()
        if self.tracker.waiting() == 0:
            self._quiet.set()

    async def wait_quiet(self) -> None:
        """Until every outcome is delivered but those the emitter holds back (`OutcomeBlocked`),
        for which nothing more comes in this run: each such partition's commits stop at its
        first blocked offset."""
        while self.tracker.waiting() > 0:
            self._quiet.clear()
            await self._quiet.wait()
        for tp, offsets in self.tracker.blocked().items():
            log.warning("offset_left_uncommitted", topic=tp.topic, partition=tp.partition,
                        offset=offsets[0], blocked=len(offsets), reason="dead letter blocked",
                        detail="read again by the partition's next owner")  # fmt: skip

    async def commit_assigned(self, *, release: bool = False) -> None:
        consumer = self._consumer()
        await self.committer.commit(
            consumer, consumer.assignment(), self.fetched_to, release=release
        )

    async def commit_loop(self) -> None:
        """Commit the contiguous-done offsets of the partitions still assigned, now and then."""
        while True:
            await asyncio.sleep(self.commit_interval_s)
            await self.commit_assigned()

    def _consumer(self) -> Consumer:
        consumer = self.reader.consumer
        if consumer is None:
            raise RuntimeError("the ingest's consumer is not started")
        return consumer
