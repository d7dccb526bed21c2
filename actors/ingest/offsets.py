"""At-least-once commit bookkeeping for Kafka partitions. Pure Python, no I/O."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping

from aiokafka.structs import TopicPartition

__all__ = ["OffsetTracker"]


class _Partition:
    __slots__ = ("blocked", "committed", "last", "open")

    def __init__(self) -> None:
        # Tracked-but-not-done offsets in tracking (= ascending) order: the first is the commit
        # point. An OrderedDict, not a heap or a deque, so that any offset leaves in O(1).
        self.open: OrderedDict[int, None] = OrderedDict()
        self.blocked: set[int] = set()  # open offsets whose outcome waits only to be delivered
        self.last = -1
        self.committed: int | None = None

    def commit_point(self) -> int:
        return next(iter(self.open)) if self.open else self.last + 1

    def rewind(self, offset: int) -> None:
        """Start again at `offset`, at or below the last tracked offset: what was tracked from
        it on is forgotten (it is read again), and so is the last commit."""
        for tracked in [o for o in self.open if o >= offset]:
            del self.open[tracked]
            self.blocked.discard(tracked)
        self.last = offset - 1
        self.committed = None

    def advanced(self) -> int | None:
        """The commit point, when it is past the last committed offset."""
        # Never committed: any commit point is news, even the first tracked offset (with
        # auto_offset_reset="latest", committing it is what keeps a crash from skipping records).
        point = self.commit_point()
        return point if self.committed is None or point > self.committed else None


class OffsetTracker:
    """Which offset each partition may commit, when records finish out of order.

    The ingest side calls `track()` for every record it consumes, in offset order; the emitter
    calls `done()` once the record's result is delivered. The commit point of a partition is
    its lowest tracked offset that is not done, or the last tracked offset + 1 when every one
    is. Offsets may have gaps (compaction, transaction markers): only tracked offsets count.

    Invariant: the commit point never passes an unfinished offset and never goes backwards
    while offsets increase, so a crash loses nothing; after a restart, only what was in flight
    is delivered again (at-least-once). Memory is O(in-flight): a partition keeps only its
    unfinished offsets, its last tracked offset and its last committed offset; `done()` is O(1).

    An offset at or below the last tracked one is a rewind: the consumer reads from there
    again (the log was truncated after an unclean leader election and the position reset to
    the earliest offset, or the consumer sought back). Tracking restarts there, as for a new
    assignment: the partition's offsets in flight from it on are forgotten (they are read
    again; a late `done()` of one is ignored, unless it is tracked again by then, when it
    marks the new read done: the record at that offset was answered), those before it are
    kept, and the last commit is forgotten, so the commit point may go back to where the
    consumer now reads. Never an error: nothing the broker does to a log stops a worker.
    (After a truncation, an offset may come back holding another record; a late `done()` of
    the old one then marks it done too. Offsets carry no more than that to tell them apart,
    and the truncation itself has already lost records.)

    An unfinished offset may be blocked (`block()`): its outcome is made but cannot be delivered
    yet (a dead letter the DLQ refuses). It still stops the commit point, but `waiting()`,
    which a drain waits on, leaves it out: nothing more comes for it in this run.

    Keys are `TopicPartition`s; plain `(topic, partition)` tuples work too.
    """

    def __init__(self) -> None:
        self._partitions: dict[TopicPartition, _Partition] = {}

    def track(self, tp: TopicPartition, offset: int) -> int | None:
        """Record that `offset` of `tp` was consumed. None, or after a rewind (an offset at or
        below the last tracked one, see the class doc) the last offset tracked before it, for
        the caller to log. A negative offset (no record has one) is a ValueError."""
        if offset < 0:
            raise ValueError(f"{tp}: offset {offset} is negative")
        state = self._partitions.get(tp)
        rewound = None
        if state is None:
            state = self._partitions[tp] = _Partition()
        elif offset <= state.last:
            rewound = state.last
            state.rewind(offset)
        state.open[offset] = None
        state.last = offset
        return rewound

    def done(self, tp: TopicPartition, offset: int) -> bool:
        """Mark a tracked offset finished; True when it was in flight.

        False, and nothing changes, for an offset never tracked, already done, or of a revoked
        partition: a late result after a rebalance is ignored, not an error.
        """
        state = self._partitions.get(tp)
        if state is None or offset not in state.open:
            return False
        del state.open[offset]
        state.blocked.discard(offset)
        return True

    def block(self, tp: TopicPartition, offset: int) -> bool:
        """Mark a tracked, unfinished offset blocked: its outcome is made and nothing runs for
        it, but it cannot be delivered yet (its dead letter waits for the DLQ). It still
        stops the commit point; `waiting()` no longer counts it. `done()` ends it as any other.
        True when it was in flight (False, and nothing changes, as for `done()`)."""
        state = self._partitions.get(tp)
        if state is None or offset not in state.open:
            return False
        state.blocked.add(offset)
        return True

    def commit_point(self, tp: TopicPartition) -> int | None:
        """The offset to commit for `tp`; None when nothing of `tp` is tracked."""
        state = self._partitions.get(tp)
        return None if state is None else state.commit_point()

    def committable(self) -> dict[TopicPartition, int]:
        """Commit points that advanced past what was last marked committed."""
        return {
            tp: point
            for tp, state in self._partitions.items()
            if (point := state.advanced()) is not None
        }

    def mark_committed(self, offsets: Mapping[TopicPartition, int]) -> None:
        """Record a successful commit; partitions no longer tracked are ignored."""
        for tp, offset in offsets.items():
            state = self._partitions.get(tp)
            if state is not None and (state.committed is None or offset > state.committed):
                state.committed = offset

    def revoke(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """Forget these partitions; returns their final commit points that advanced."""
        final: dict[TopicPartition, int] = {}
        for tp in tps:
            state = self._partitions.pop(tp, None)
            if state is not None and (point := state.advanced()) is not None:
                final[tp] = point
        return final

    def in_flight(self, tp: TopicPartition | None = None) -> int:
        """Offsets tracked and not done, of `tp` or of every partition."""
        if tp is None:
            return sum(len(state.open) for state in self._partitions.values())
        state = self._partitions.get(tp)
        return 0 if state is None else len(state.open)

    def waiting(self, tps: Iterable[TopicPartition] | None = None) -> int:
        """Offsets tracked and not done, less the blocked ones: those whose work is still on its
        way (what a drain waits for), of `tps` or of every partition."""
        states = (
            self._partitions.values()
            if tps is None
            else [s for tp in tps if (s := self._partitions.get(tp)) is not None]
        )
        return sum(len(state.open) - len(state.blocked) for state in states)

    def blocked(self) -> dict[TopicPartition, list[int]]:
        """The blocked offsets (see `block`), ascending, of each partition that has any."""
        return {
            tp: sorted(state.blocked) for tp, state in self._partitions.items() if state.blocked
        }

    def partitions(self) -> set[TopicPartition]:
        return set(self._partitions)
