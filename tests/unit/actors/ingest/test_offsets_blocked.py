"""Blocked offsets (`OffsetTracker.block`): an outcome made but held back (its dead letter refused
by the DLQ) still stops the commit point, but is no longer waited for (`waiting`)."""

from __future__ import annotations

from aiokafka.structs import TopicPartition

from actors.ingest.offsets import OffsetTracker

TP = TopicPartition("requests", 0)
OTHER = TopicPartition("requests", 1)


def tracker_with(tp: TopicPartition, *offsets: int) -> OffsetTracker:
    tracker = OffsetTracker()
    for offset in offsets:
        tracker.track(tp, offset)
    return tracker


def test_a_blocked_offset_stops_the_commit_point_but_is_not_waited_for() -> None:
    tracker = tracker_with(TP, 0, 1, 2)
    assert tracker.block(TP, 1)
    tracker.done(TP, 0)
    tracker.done(TP, 2)
    assert tracker.commit_point(TP) == 1
    assert (tracker.in_flight(), tracker.waiting()) == (1, 0)
    assert tracker.blocked() == {TP: [1]}


def test_done_ends_a_blocked_offset_as_any_other() -> None:
    tracker = tracker_with(TP, 0, 1)
    tracker.block(TP, 0)
    assert tracker.done(TP, 0)
    assert tracker.blocked() == {} and tracker.waiting() == 1
    assert tracker.commit_point(TP) == 1


def test_only_an_offset_in_flight_can_be_blocked() -> None:
    tracker = tracker_with(TP, 0, 1)
    tracker.done(TP, 0)
    assert not tracker.block(TP, 0)  # done already
    assert not tracker.block(TP, 5)  # never tracked
    assert not tracker.block(OTHER, 0)  # a partition not held
    assert tracker.blocked() == {} and tracker.waiting() == 1


def test_blocked_offsets_are_listed_ascending_per_partition() -> None:
    tracker = tracker_with(TP, 3, 4, 9)
    tracker.track(OTHER, 7)
    for tp, offset in [(TP, 9), (OTHER, 7), (TP, 4)]:
        tracker.block(tp, offset)
    assert tracker.blocked() == {TP: [4, 9], OTHER: [7]}
    assert tracker.waiting() == 1  # offset 3 of TP


def test_a_rewind_or_a_revoke_forgets_what_it_blocked() -> None:
    tracker = tracker_with(TP, 0, 1, 2)
    tracker.track(OTHER, 5)
    tracker.block(TP, 2)
    tracker.block(OTHER, 5)
    tracker.track(TP, 1)  # a rewind to 1: 1 and 2 are read again
    tracker.revoke([OTHER])
    assert tracker.blocked() == {}
    assert tracker.waiting() == tracker.in_flight() == 2  # 0, and 1 read again
