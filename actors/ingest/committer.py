"""The ingest's commits: the offsets the `OffsetTracker` allows, with the `CrashGuard`'s metadata.

    await committer.take_over(consumer, assigned)            last commits, to the crash guard
    await committer.fetched(consumer, first, to)              before fetched records run
    await committer.fetched(consumer, first, to, verify=True) and after a stall, is it still ours?
    await committer.commit(consumer, assigned, fetched_to)   progress, and what is in flight
    await committer.commit(consumer, revoked, fetched_to, release=True)   giving them up

Only partitions the consumer owns at the time are committed: after a rebalance (or a pause
that outlived the session) a lost partition's offsets are its new owner's to write.

A commit is written when a partition's offset or its metadata changed. The metadata records
what is in flight, so it is written before fetched records run (`fetched()`): a worker that
dies while running them leaves that behind. To keep that off the consume loop's path, it
counts `headroom` more records than were fetched, and a fetch commits only when it passes
that mark. A failed commit is logged and retried by the next one.

With `--exactly-once` the commits are not the consumer's to write: `write` puts them in each
partition's next transaction (see `actors.transactions`), beside the results, and the
metadata of a commit read at assignment carries the offsets answered above it too
(`answered`), which the ledger does not run again.

A commit is also the one way to ask the group whether this member is still in it: `verify`
writes one even when nothing changed, and says False when the group refused it (fenced).

Offsets that go back (a rewind, see `OffsetTracker`: a truncated log, a position reset to the
earliest offset) raise nothing here: the lower commit point is written like any other (it is
where the consumer reads now), and the in-flight mark is never lowered, so the metadata still
counts what was fetched before the rewind as in flight until it is read past again (a crash
meanwhile makes more records suspects than needed, never fewer).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, TypeAlias, cast

import structlog
from aiokafka.errors import CommitFailedError, KafkaError
from aiokafka.structs import OffsetAndMetadata, TopicPartition

from actors.ingest.crash_guard import RELEASED, CrashGuard, parse
from actors.ingest.offsets import OffsetTracker
from actors.kafka.partition_reader import Consumer, names
from actors.transactions.answered import AnsweredOffsets, split

log = structlog.get_logger("tokenmill.ingest")

# With --exactly-once, how a commit is written instead of `consumer.commit`: in the partitions'
# transactions (False: a partition's lane was fenced, and nothing was written).
Write: TypeAlias = Callable[[dict[TopicPartition, tuple[int, str]]], Awaitable[bool]]


class Committer:
    def __init__(
        self,
        tracker: OffsetTracker,
        guard: CrashGuard,
        *,
        headroom: int,
        write: Write | None = None,
    ) -> None:
        """`headroom`: records past the fetched ones counted as in flight, so that a fetch
        needs a commit of its own only once per `headroom` records (not every fetch);
        `write`: how commits are written (default: `consumer.commit`)."""
        self.tracker = tracker
        self.guard = guard
        self.headroom = headroom
        self.write = write
        # What the last commits read at assignment say was answered above them.
        self.answered: dict[TopicPartition, AnsweredOffsets] = {}
        self.taken: dict[TopicPartition, tuple[int | None, str]] = {}  # those commits
        self._written: dict[TopicPartition, tuple[int, str]] = {}  # last commit, per partition
        self._in_flight_to: dict[TopicPartition, int] = {}  # the "fetched" on record
        self._lock = asyncio.Lock()  # one commit at a time, so `_written` stays true

    async def take_over(self, consumer: Consumer, assigned: set[TopicPartition]) -> None:
        """Read the last commit of each newly assigned partition, metadata and all, and hand
        it to the crash guard (`taken` and `answered` keep what it said)."""
        if not assigned:
            return
        try:
            # The consumer's `committed()` returns the offset only; its coordinator has the
            # metadata beside it (the same OffsetFetch request).
            coordinator = cast(Any, consumer)._coordinator
            commits = await coordinator.fetch_committed_offsets(list(assigned))
        except KafkaError as exc:  # no guard this time: the records run as usual
            log.warning("commits_unread", error=repr(exc))
            return
        for tp in assigned:  # read: those with no commit yet start from nothing
            self.taken[tp], self.answered[tp] = (None, ""), AnsweredOffsets()
        metadata = {}
        for tp, commit in commits.items():
            base = commit.offset if commit.offset >= 0 else None
            metadata[tp], self.answered[tp] = split(commit.metadata, base)
            self.taken[tp] = (base, metadata[tp])
        held = [tp for tp in commits if parse(metadata[tp]) is not None]
        try:
            ends = await consumer.end_offsets(held) if held else {}
        except KafkaError as exc:  # the guard then counts what the metadata says
            log.warning("end_offsets_unread", error=repr(exc))
            ends = {}
        for tp, commit in commits.items():
            offset = commit.offset if commit.offset >= 0 else None
            deaths = self.assigned(tp, offset, metadata[tp], ends.get(tp))
            if offset is not None and self.guard.isolating(tp, offset):
                log.warning("worker_died_with_records", topic=tp.topic, partition=tp.partition,
                            offset=offset, deaths=deaths,
                            quarantine_at=self.guard.max_crashes)  # fmt: skip

    def assigned(
        self, tp: TopicPartition, committed: int | None, metadata: str, log_end: int | None
    ) -> int:
        """`tp` is ours from its last commit; the deaths the guard now pins on it."""
        if committed is not None:
            self._written[tp] = (committed, metadata)
        return self.guard.assigned(tp, committed, metadata, log_end)

    def forget(self, tps: Iterable[TopicPartition]) -> None:
        for tp in tps:
            self._written.pop(tp, None)
            self._in_flight_to.pop(tp, None)
            self.answered.pop(tp, None)
            self.taken.pop(tp, None)
            self.guard.revoked(tp)

    async def fetched(
        self,
        consumer: Consumer,
        first: Mapping[TopicPartition, int],
        to: Mapping[TopicPartition, int],
        *,
        verify: bool = False,
    ) -> bool:
        """Records [first, to) of each partition were just fetched: before they run, make sure
        the last commit counts them in flight (with headroom, so this rarely commits).

        `verify`: commit whether or not anything changed. False when that commit (or one made
        anyway) was fenced: the records are no longer this member's to run."""
        behind = {
            tp: end for tp, end in to.items() if verify or end > self._in_flight_to.get(tp, -1)
        }
        if not behind:
            return True
        for tp, end in behind.items():
            self._in_flight_to[tp] = max(self._in_flight_to.get(tp, -1), end + self.headroom)
        return await self.commit(consumer, behind, {}, first_fetched=first, force=verify)

    async def commit(
        self,
        consumer: Consumer,
        partitions: Iterable[TopicPartition],
        fetched_to: Mapping[TopicPartition, int],
        *,
        release: bool = False,
        first_fetched: Mapping[TopicPartition, int] | None = None,
        force: bool = False,
    ) -> bool:
        """Commit each partition's commit point (or its last commit, or `first_fetched` when
        there is neither yet) with the guard's metadata, or "released"; `force`: even what is
        already written. False when the group fenced this member (nothing was written)."""
        async with self._lock:
            offsets: dict[TopicPartition, OffsetAndMetadata] = {}
            owned = consumer.assignment()
            for tp in partitions:
                if tp not in owned:  # lost in a rebalance: its new owner commits it now
                    log.info("commit_skipped_not_owned", topic=tp.topic, partition=tp.partition)
                    continue
                point = self.tracker.commit_point(tp)
                written = self._written.get(tp)
                offset = point if point is not None else written[0] if written else None
                if offset is None and first_fetched is not None:
                    offset = first_fetched.get(tp)
                if offset is None:
                    continue  # nothing read from it, nothing committed yet
                fetched = max(fetched_to.get(tp, offset), self._in_flight_to.get(tp, offset))
                meta = RELEASED if release else self.guard.metadata(tp, offset, fetched)
                if force or written != (offset, meta):
                    offsets[tp] = OffsetAndMetadata(offset, meta)
            if not offsets:
                return True
            try:
                wanted = {tp: (o.offset, o.metadata) for tp, o in offsets.items()}
                if self.write is None:
                    await consumer.commit(wanted)
                elif not await self.write(wanted):
                    raise CommitFailedError("a partition's transactional producer was fenced")
            except CommitFailedError as exc:
                # Fenced: the group moved on without this member (a pause that outlived its
                # session). Nothing was written; the partitions' new owners answer again
                # what this worker had not committed (at most duplicates).
                log.warning("commit_fenced", partitions=names(offsets), error=repr(exc))
                return False
            except KafkaError as exc:  # a rebalance in progress: the next commit catches up
                log.warning("commit_failed", error=repr(exc))
                return True
            for tp, o in offsets.items():
                self._written[tp] = (o.offset, o.metadata)
            self.tracker.mark_committed({tp: o.offset for tp, o in offsets.items()})
            return True
