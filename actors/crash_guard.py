"""Records that crash workers: counted where the count outlives the process, then quarantined.

A record that kills the process running it (a crash in native code, an out-of-memory kill, a
bug that takes the worker down) is read again by the next worker of the group, which dies the
same way, and so on until someone deletes the record. The count of such deaths therefore lives
in Kafka, in the consumer group: every commit of a partition carries, as its offset metadata,

    tokenmill/1 held <fetched> <deaths> <alone>
        while a worker holds the partition: `fetched`, the first offset not yet read, so
        [committed, fetched) was in flight; `deaths`, the workers that died running the
        committed record alone; `alone` (0/1), whether it is now being run alone
    tokenmill/1 released
        written when a worker gives the partition up cleanly

A worker assigned a partition whose metadata says "held" with records in flight knows that
the last holder vanished with them. It runs those records one at a time ("isolation"),
committing after each, so a death is pinned on the one record that was running: a record
gets one more death when the worker that vanished was running it alone (or it was the only
record in flight). A record with `max_crashes` deaths is quarantined: answered with
`quarantined`, its bytes to the DLQ, never run again. A death with many records in flight
pins nothing: it only starts isolation. (Kafka Streams' and Spring Kafka's skip-and-
dead-letter after bounded retries, for failures that take the process with them.)

Pure logic, no I/O: the ingest reads the committed metadata at assignment and writes what
`metadata()` returns with each commit.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

PREFIX = "tokenmill/1"
RELEASED = f"{PREFIX} released"


@dataclass(frozen=True)
class Held:
    fetched: int  # the first offset the holder had not read
    deaths: int  # holders that died running the committed record alone
    alone: bool  # the holder was running the committed record alone


def held(fetched: int, deaths: int, alone: bool = False) -> str:
    return f"{PREFIX} held {fetched} {deaths} {int(alone)}"


def parse(metadata: str | None) -> Held | None:
    """The "held" state in a commit's metadata; None for "released", empty or foreign."""
    parts = (metadata or "").split()
    if len(parts) != 5 or parts[0] != PREFIX or parts[1] != "held" or parts[4] not in "01":
        return None
    try:
        fetched, deaths = int(parts[2]), int(parts[3])
    except ValueError:
        return None
    return Held(fetched, deaths, parts[4] == "1") if fetched >= 0 and deaths >= 0 else None


@dataclass
class _Partition:
    at: int  # the committed offset the deaths are pinned on
    deaths: int
    isolate_until: int  # records below this offset run one at a time


class CrashGuard:
    """Per assigned partition: deaths so far, the isolation range, what to commit."""

    def __init__(self, max_crashes: int) -> None:
        if max_crashes < 1:
            raise ValueError(f"max_crashes must be ≥ 1, got {max_crashes}")
        self.max_crashes = max_crashes
        self._partitions: dict[Hashable, _Partition] = {}

    def assigned(self, tp: Hashable, committed: int | None, metadata: str | None) -> int:
        """Take over `tp` from its last commit; the deaths now pinned on `committed`. What was in
        flight when the last holder vanished runs alone from now on."""
        state = parse(metadata)
        if committed is None or state is None or state.fetched <= committed:
            self._partitions.pop(tp, None)  # released cleanly, or nothing was in flight
            return 0
        ran_alone = state.alone or state.fetched == committed + 1
        deaths = state.deaths + 1 if ran_alone else 0
        self._partitions[tp] = _Partition(committed, deaths, isolate_until=state.fetched)
        return deaths

    def revoked(self, tp: Hashable) -> None:
        self._partitions.pop(tp, None)

    def metadata(self, tp: Hashable, offset: int, fetched: int) -> str:
        """What to commit with `offset` of `tp` while holding it (`fetched`: first unread)."""
        state = self._partitions.get(tp)
        deaths = state.deaths if state is not None and state.at == offset else 0
        # After a death, what was in flight stays in flight until isolation has run it.
        if state is not None:
            fetched = max(fetched, state.isolate_until)
        return held(max(fetched, offset), deaths, alone=self.isolating(tp, offset))

    def isolating(self, tp: Hashable, offset: int) -> bool:
        """Whether the record at `offset` must run alone (it was in flight at a death)."""
        state = self._partitions.get(tp)
        return state is not None and offset < state.isolate_until

    def quarantined(self, tp: Hashable, offset: int) -> int | None:
        """The deaths of the record at `offset` when it is to be quarantined, else None."""
        state = self._partitions.get(tp)
        if state is not None and state.at == offset and state.deaths >= self.max_crashes:
            return state.deaths
        return None
