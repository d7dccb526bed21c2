"""The offset tracker: the commit point never passes an unfinished offset, never goes back."""

from __future__ import annotations

from itertools import accumulate

import pytest
from aiokafka.structs import TopicPartition
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from actors.ingest.offsets import OffsetTracker

TP = TopicPartition("requests", 0)
OTHER = TopicPartition("requests", 1)


def tracker_with(tp: TopicPartition, *offsets: int) -> OffsetTracker:
    tracker = OffsetTracker()
    for offset in offsets:
        tracker.track(tp, offset)
    return tracker


def held_offsets(tracker: OffsetTracker) -> int:
    """Offsets the tracker keeps in memory, over all partitions."""
    return sum(len(state.open) for state in tracker._partitions.values())


def test_nothing_tracked_has_no_commit_point() -> None:
    tracker = OffsetTracker()
    assert tracker.commit_point(TP) is None
    assert tracker.committable() == {}
    assert tracker.in_flight() == tracker.in_flight(TP) == 0
    assert tracker.partitions() == set()


def test_the_commit_point_is_the_lowest_unfinished_offset() -> None:
    tracker = tracker_with(TP, 0, 1, 2)
    assert tracker.commit_point(TP) == 0
    assert tracker.done(TP, 2)
    assert tracker.commit_point(TP) == 0
    assert tracker.done(TP, 0)
    assert tracker.commit_point(TP) == 1
    assert tracker.done(TP, 1)
    assert tracker.commit_point(TP) == 3


def test_gaps_between_offsets_do_not_hold_the_commit_point_back() -> None:
    tracker = tracker_with(TP, 5, 7, 10)
    tracker.done(TP, 5)
    assert tracker.commit_point(TP) == 7
    tracker.done(TP, 10)
    tracker.done(TP, 7)
    assert tracker.commit_point(TP) == 11


def test_tracking_after_everything_finished_moves_the_commit_point_to_it() -> None:
    tracker = tracker_with(TP, 3)
    tracker.done(TP, 3)
    tracker.track(TP, 9)
    assert tracker.commit_point(TP) == 9


@pytest.mark.parametrize("offset", [4, 3])
def test_an_offset_that_does_not_increase_is_a_rewind_not_an_error(offset: int) -> None:
    tracker = tracker_with(TP, 4)
    assert tracker.track(TP, offset) == 4  # the last offset before the rewind
    assert tracker.in_flight(TP) == 1 and tracker.commit_point(TP) == offset


def test_a_negative_offset_is_refused() -> None:
    with pytest.raises(ValueError, match="negative"):
        OffsetTracker().track(TP, -1)


def test_partitions_are_independent() -> None:
    tracker = tracker_with(TP, 100)
    tracker.track(OTHER, 5)
    tracker.done(OTHER, 5)
    assert tracker.commit_point(TP) == 100
    assert tracker.commit_point(OTHER) == 6
    assert tracker.partitions() == {TP, OTHER}
    assert (tracker.in_flight(TP), tracker.in_flight(OTHER), tracker.in_flight()) == (1, 0, 1)


def test_done_of_anything_not_in_flight_is_ignored() -> None:
    tracker = tracker_with(TP, 1, 3)
    assert not tracker.done(OTHER, 1)
    assert not tracker.done(TP, 2)
    assert not tracker.done(TP, 4)
    assert tracker.done(TP, 1)
    assert not tracker.done(TP, 1)
    assert tracker.commit_point(TP) == 3
    assert tracker.in_flight(TP) == 1


def test_plain_tuples_and_topic_partitions_name_the_same_partition() -> None:
    tracker = tracker_with(TP, 0)
    assert tracker.done(("requests", 0), 0)
    assert tracker.commit_point(("requests", 0)) == 1
    assert tracker.committable() == {TP: 1}


def test_committable_lists_only_commit_points_that_advanced() -> None:
    tracker = tracker_with(TP, 10, 11)
    tracker.track(OTHER, 0)
    assert tracker.committable() == {TP: 10, OTHER: 0}
    tracker.mark_committed({TP: 10, OTHER: 0})
    assert tracker.committable() == {}
    tracker.done(TP, 11)
    assert tracker.committable() == {}
    tracker.done(TP, 10)
    assert tracker.committable() == {TP: 12}
    tracker.mark_committed({TP: 12})
    assert tracker.committable() == {}


def test_mark_committed_never_goes_backwards_and_ignores_unknown_partitions() -> None:
    tracker = tracker_with(TP, 0, 1)
    tracker.done(TP, 0)
    tracker.mark_committed({TP: 1})
    tracker.mark_committed({TP: 0, OTHER: 7})
    assert tracker.committable() == {}
    assert tracker.partitions() == {TP}


def test_revoke_returns_the_final_commit_points_that_advanced_and_forgets() -> None:
    tracker = tracker_with(TP, 0, 1, 2)
    tracker.track(OTHER, 50)
    tracker.mark_committed({TP: 0, OTHER: 50})
    tracker.done(TP, 0)
    gone = TopicPartition("elsewhere", 0)
    assert tracker.revoke([TP, OTHER, gone]) == {TP: 1}
    assert tracker.partitions() == set()
    assert tracker.commit_point(TP) is None
    assert not tracker.done(TP, 1)
    assert tracker.in_flight() == 0


def test_a_partition_assigned_again_starts_afresh() -> None:
    tracker = tracker_with(TP, 10, 11)
    tracker.done(TP, 10)
    tracker.revoke([TP])
    tracker.track(TP, 11)
    assert tracker.commit_point(TP) == 11
    assert tracker.committable() == {TP: 11}


def test_memory_holds_only_what_is_in_flight() -> None:
    tracker = OffsetTracker()
    for offset in range(0, 20_000, 2):
        tracker.track(TP, offset)
    for offset in range(2, 20_000, 2):
        tracker.done(TP, offset)
    assert held_offsets(tracker) == tracker.in_flight() == 1
    assert tracker.commit_point(TP) == 0
    tracker.done(TP, 0)
    assert held_offsets(tracker) == 0
    assert tracker.commit_point(TP) == 19_999


@settings(max_examples=200, deadline=None)
@given(
    gaps=st.lists(st.integers(1, 5), min_size=1, max_size=40),
    start=st.integers(0, 1000),
    data=st.data(),
)
def test_finishing_in_any_order_advances_to_last_plus_one(
    gaps: list[int], start: int, data: st.DataObject
) -> None:
    offsets = [start + total for total in accumulate(gaps)]
    tracker = tracker_with(TP, *offsets)
    order = data.draw(st.permutations(offsets))
    unfinished = set(offsets)
    previous = tracker.commit_point(TP)
    for offset in order:
        assert tracker.done(TP, offset)
        unfinished.discard(offset)
        point = tracker.commit_point(TP)
        assert point is not None and previous is not None
        assert point >= previous
        assert point == (min(unfinished) if unfinished else offsets[-1] + 1)
        assert held_offsets(tracker) == len(unfinished)
        previous = point


PARTITIONS = [TopicPartition("requests", p) for p in range(3)]


class TrackerMachine(RuleBasedStateMachine):
    """Random interleavings of track, done, commit and revoke over a few partitions."""

    def __init__(self) -> None:
        super().__init__()
        self.tracker = OffsetTracker()
        self.tracked: dict[TopicPartition, list[int]] = {}
        self.finished: dict[TopicPartition, set[int]] = {}
        self.committed: dict[TopicPartition, int] = {}
        self.last_point: dict[TopicPartition, int] = {}

    def unfinished(self, tp: TopicPartition) -> list[int]:
        return [o for o in self.tracked.get(tp, []) if o not in self.finished[tp]]

    @rule(tp=st.sampled_from(PARTITIONS), gap=st.integers(1, 3), start=st.integers(0, 50))
    def track(self, tp: TopicPartition, gap: int, start: int) -> None:
        offsets = self.tracked.setdefault(tp, [])
        self.finished.setdefault(tp, set())
        offset = offsets[-1] + gap if offsets else start
        self.tracker.track(tp, offset)
        offsets.append(offset)

    @rule(tp=st.sampled_from(PARTITIONS), data=st.data())
    def rewind(self, tp: TopicPartition, data: st.DataObject) -> None:
        """The consumer reads again from an offset at or below the last tracked one."""
        offsets = self.tracked.get(tp)
        if not offsets:
            return
        offset = data.draw(st.integers(max(offsets[0] - 3, 0), offsets[-1]))
        assert self.tracker.track(tp, offset) == offsets[-1]
        self.tracked[tp] = [o for o in offsets if o < offset] + [offset]
        self.finished[tp] = {o for o in self.finished[tp] if o < offset}
        self.committed.pop(tp, None)
        self.last_point.pop(tp, None)  # the commit point may go back: afresh from here

    @rule(tp=st.sampled_from(PARTITIONS), data=st.data())
    def done(self, tp: TopicPartition, data: st.DataObject) -> None:
        candidates = [*self.tracked.get(tp, []), 10_000]
        offset = data.draw(st.sampled_from(candidates))
        in_flight = offset in self.unfinished(tp)
        assert self.tracker.done(tp, offset) == in_flight
        if in_flight:
            self.finished[tp].add(offset)

    @rule()
    def commit(self) -> None:
        offsets = self.tracker.committable()
        for tp, point in offsets.items():
            assert tp not in self.committed or point > self.committed[tp]
        self.tracker.mark_committed(offsets)
        self.committed.update(offsets)
        assert self.tracker.committable() == {}

    @rule(tps=st.sets(st.sampled_from(PARTITIONS)))
    def revoke(self, tps: set[TopicPartition]) -> None:
        expected = {
            tp: point
            for tp in tps
            if (point := self.tracker.commit_point(tp)) is not None
            and (tp not in self.committed or point > self.committed[tp])
        }
        assert self.tracker.revoke(tps) == expected
        for tp in tps:
            self.tracked.pop(tp, None)
            self.finished.pop(tp, None)
            self.committed.pop(tp, None)
            self.last_point.pop(tp, None)

    @invariant()
    def commit_point_is_the_lowest_unfinished_or_last_plus_one(self) -> None:
        for tp in PARTITIONS:
            point = self.tracker.commit_point(tp)
            if tp not in self.tracked:
                assert point is None
                continue
            unfinished = self.unfinished(tp)
            assert point == (unfinished[0] if unfinished else self.tracked[tp][-1] + 1)
            assert all(point <= o for o in unfinished)
            assert point >= self.last_point.get(tp, point)
            self.last_point[tp] = point

    @invariant()
    def memory_is_bounded_by_in_flight(self) -> None:
        in_flight = sum(len(self.unfinished(tp)) for tp in self.tracked)
        assert held_offsets(self.tracker) == self.tracker.in_flight() == in_flight
        assert self.tracker.partitions() == set(self.tracked)


TrackerMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)
test_tracker_machine = TrackerMachine.TestCase
