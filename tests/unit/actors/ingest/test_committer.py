"""The committer's decisions: what it commits, with which metadata, and when it need not."""

from __future__ import annotations

from typing import Any

from aiokafka.errors import CommitFailedError
from aiokafka.structs import TopicPartition

from actors.ingest.committer import Committer
from actors.ingest.crash_guard import RELEASED, CrashGuard, Held, parse
from actors.ingest.offsets import OffsetTracker

TP = TopicPartition("requests", 0)


class Consumer:
    """Owns `owned`, takes commits and remembers them (the committer's only uses of a
    consumer here); `fenced`: the group has moved on, so every commit fails."""

    def __init__(self, owned: set[TopicPartition] | None = None) -> None:
        self.commits: list[dict[TopicPartition, tuple[int, str]]] = []
        self.owned = {TP} if owned is None else owned
        self.fenced = False

    def assignment(self) -> set[TopicPartition]:
        return set(self.owned)

    async def commit(self, offsets: dict[TopicPartition, tuple[int, str]]) -> None:
        if self.fenced:
            raise CommitFailedError("the group rebalanced without this member")
        self.commits.append(dict(offsets))


def committer(headroom: int = 100) -> tuple[Committer, OffsetTracker]:
    tracker = OffsetTracker()
    return Committer(tracker, CrashGuard(3), headroom=headroom), tracker


async def test_a_fetch_commits_what_is_in_flight_only_once_per_headroom() -> None:
    consumer: Any = Consumer()
    c, tracker = committer(headroom=100)
    await c.fetched(consumer, {TP: 0}, {TP: 10})
    assert consumer.commits == [{TP: (0, "tokenmill/1 held 110 0 0")}]
    for offset in range(10):
        tracker.track(TP, offset)
    await c.fetched(consumer, {TP: 10}, {TP: 60})  # still within the headroom
    await c.fetched(consumer, {TP: 60}, {TP: 110})
    assert len(consumer.commits) == 1
    await c.fetched(consumer, {TP: 110}, {TP: 111})
    assert consumer.commits[-1] == {TP: (0, "tokenmill/1 held 211 0 0")}


async def test_progress_keeps_the_in_flight_mark_and_a_release_says_so() -> None:
    consumer: Any = Consumer()
    c, tracker = committer(headroom=100)
    await c.fetched(consumer, {TP: 0}, {TP: 3})
    for offset in range(3):
        tracker.track(TP, offset)
    tracker.done(TP, 0)
    tracker.done(TP, 1)
    await c.commit(consumer, [TP], {TP: 3})
    assert consumer.commits[-1] == {TP: (2, "tokenmill/1 held 103 0 0")}
    await c.commit(consumer, [TP], {TP: 3})  # nothing changed: no commit
    assert len(consumer.commits) == 2
    await c.commit(consumer, [TP], {TP: 3}, release=True)
    assert consumer.commits[-1] == {TP: (2, RELEASED)}


async def test_a_taken_over_partition_commits_its_isolated_chunk_as_in_flight() -> None:
    consumer: Any = Consumer()
    c, _ = committer()
    assert c.assigned(TP, 10, "tokenmill/1 held 18 0 0", log_end=None) == 0
    await c.fetched(consumer, {TP: 10}, {TP: 18})
    ((offset, metadata),) = consumer.commits[-1].values()
    assert offset == 10 and parse(metadata) == Held(14, 0, alone=False)


async def test_only_partitions_the_consumer_owns_are_committed() -> None:
    """A partition lost in a rebalance is its new owner's to commit, whatever was tracked."""
    other = TopicPartition("requests", 1)
    consumer: Any = Consumer(owned={TP})
    c, tracker = committer()
    for tp in (TP, other):
        tracker.track(tp, 0)
        tracker.done(tp, 0)
    await c.commit(consumer, [TP, other], {TP: 1, other: 1})
    assert [set(commit) for commit in consumer.commits] == [{TP}]


async def test_a_fenced_commit_writes_nothing_and_is_not_marked_done() -> None:
    """A member the group has moved on without (a pause past its session) is refused."""
    consumer: Any = Consumer()
    c, tracker = committer()
    tracker.track(TP, 0)
    tracker.done(TP, 0)
    consumer.fenced = True
    await c.commit(consumer, [TP], {TP: 1})
    assert consumer.commits == []
    consumer.fenced = False  # rejoined, still the owner: the commit is written then
    await c.commit(consumer, [TP], {TP: 1})
    assert consumer.commits[-1][TP][0] == 1


async def test_a_verifying_fetch_commits_even_within_the_headroom_and_says_when_fenced() -> None:
    """After a stall, a fetch asks the group (a commit) whether it is still a member."""
    consumer: Any = Consumer()
    c, _ = committer(headroom=100)
    assert await c.fetched(consumer, {TP: 0}, {TP: 10})
    assert await c.fetched(consumer, {TP: 10}, {TP: 20})  # within the headroom: no commit
    assert len(consumer.commits) == 1
    assert await c.fetched(consumer, {TP: 20}, {TP: 30}, verify=True)
    assert len(consumer.commits) == 2
    consumer.fenced = True
    assert not await c.fetched(consumer, {TP: 30}, {TP: 40}, verify=True)
    assert len(consumer.commits) == 2


async def test_a_forced_commit_writes_what_is_already_written() -> None:
    consumer: Any = Consumer()
    c, tracker = committer()
    tracker.track(TP, 0)
    tracker.done(TP, 0)
    assert await c.commit(consumer, [TP], {TP: 1})
    assert await c.commit(consumer, [TP], {TP: 1})  # unchanged: nothing sent
    assert len(consumer.commits) == 1
    assert await c.commit(consumer, [TP], {TP: 1}, force=True)
    assert len(consumer.commits) == 2
