"""An offset that goes backwards (a log truncated after an unclean leader election, a position
reset to the earliest offset, a seek back) restarts a partition's tracking there: never an
error, and the commit point never passes an offset read again and not yet finished."""

from __future__ import annotations

from typing import Any

from aiokafka.structs import TopicPartition

from actors.ingest.committer import Committer
from actors.ingest.crash_guard import CrashGuard
from actors.ingest.offsets import OffsetTracker
from tests.unit.actors.ingest.test_committer import Consumer

TP = TopicPartition("requests", 0)
OTHER = TopicPartition("requests", 1)


def tracked(*offsets: int) -> OffsetTracker:
    tracker = OffsetTracker()
    for offset in offsets:
        tracker.track(TP, offset)
    return tracker


def test_a_rewind_forgets_what_is_read_again_and_keeps_what_is_before_it() -> None:
    tracker = tracked(10, 11, 12, 13)
    tracker.done(TP, 12)
    assert tracker.track(TP, 11) == 13
    assert tracker.in_flight(TP) == 2  # 10, kept; 11, read again
    assert tracker.commit_point(TP) == 10
    assert tracker.done(TP, 10)
    assert tracker.commit_point(TP) == 11, "not past the offset read again"
    assert not tracker.done(TP, 13), "forgotten: a late done of it is ignored"
    tracker.track(TP, 12)
    tracker.track(TP, 13)
    for offset in (11, 12, 13):
        assert tracker.done(TP, offset)
    assert tracker.commit_point(TP) == 14


def test_a_rewind_to_the_same_offset_reads_it_again() -> None:
    tracker = tracked(5)
    assert tracker.track(TP, 5) == 5
    assert tracker.in_flight(TP) == 1 and tracker.commit_point(TP) == 5
    assert tracker.done(TP, 5)
    assert tracker.commit_point(TP) == 6


def test_after_a_rewind_the_lower_commit_point_is_news() -> None:
    """Truncated below the last commit: where the consumer reads now is committed (else a
    restarted worker's committed offset would be past the log's end, and the whole partition
    read again from its start)."""
    tracker = tracked(100, 101)
    tracker.done(TP, 100)
    tracker.done(TP, 101)
    tracker.mark_committed({TP: 102})
    assert tracker.committable() == {}
    tracker.track(TP, 40)
    assert tracker.committable() == {TP: 40}
    tracker.mark_committed({TP: 40})
    tracker.done(TP, 40)
    assert tracker.committable() == {TP: 41}


def test_a_rewind_leaves_other_partitions_alone() -> None:
    tracker = tracked(1, 2)
    tracker.track(OTHER, 7)
    tracker.track(TP, 0)
    assert tracker.in_flight(OTHER) == 1 and tracker.commit_point(OTHER) == 7


async def test_the_committer_commits_the_rewound_point_and_keeps_what_was_in_flight() -> None:
    """The committer takes a commit point that went back as any other: it commits where the
    consumer reads now, and its in-flight mark still covers what was fetched before (a crash
    then makes the whole range suspect: more cautious than needed, never less)."""
    consumer: Any = Consumer()
    tracker = OffsetTracker()
    c = Committer(tracker, CrashGuard(3), headroom=10)
    await c.fetched(consumer, {TP: 50}, {TP: 53})
    for offset in (50, 51, 52):
        tracker.track(TP, offset)
        tracker.done(TP, offset)
    await c.commit(consumer, [TP], {TP: 53})
    assert consumer.commits[-1] == {TP: (53, "tokenmill/1 held 63 0 0")}
    tracker.track(TP, 20)  # the position was reset to the log's start
    await c.fetched(consumer, {TP: 20}, {TP: 21})
    await c.commit(consumer, [TP], {TP: 21})
    assert consumer.commits[-1] == {TP: (20, "tokenmill/1 held 63 0 0")}
    tracker.done(TP, 20)
    await c.commit(consumer, [TP], {TP: 21})
    assert consumer.commits[-1] == {TP: (21, "tokenmill/1 held 63 0 0")}
