"""Records that crash workers: counted where the count outlives the process, then quarantined.

A record that kills the process running it (a crash in native code, an out-of-memory kill, a
bug that takes the worker down) is read again by the next worker of the group, which dies the
same way, and so on until someone deletes the record. The count of such deaths therefore lives
in Kafka, in the consumer group: every commit of a partition carries, as its offset metadata,

    tokenmill/1 held <fetched> <deaths> <alone>
        while a worker holds the partition: `fetched`, the first offset not yet read (while
        isolating: the end of the chunk running), so [committed, fetched) is in flight;
        `deaths`, the workers that died running the committed record alone; `alone` (0/1),
        whether it is now being run alone
    tokenmill/1 released
        written when a worker gives the partition up cleanly

A worker assigned a partition whose metadata says "held" with records in flight knows that
the last holder vanished with them: they are suspects. It runs them in chunks of half their
number ("isolation"), each chunk on its own and committed before the next, the metadata
naming the chunk as what is in flight. A death while a chunk runs makes that chunk the next
holder's suspects, halved again: after about log2(suspects) deaths one record runs alone.
A record gets a death when the worker that vanished was running it alone (or it was the
only record in flight); with `max_crashes` deaths it is quarantined: answered with
`quarantined`, its bytes to the DLQ, never run again. So a worker killed for reasons of its
own (a deploy, a lost node) costs the next one little: its records run in two halves.
(Kafka Streams' and Spring Kafka's skip-and-dead-letter after bounded retries, for failures
that take the process with them.)

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
    at: int  # the committed offset the deaths are pinned on, where isolation starts
    deaths: int
    isolate_until: int  # the suspects: [at, isolate_until)
    chunk: int  # records that run together while isolating

    def chunk_end(self, offset: int) -> int:
        """The end of the chunk that `offset` runs in (chunks are counted from `at`)."""
        return min(
            self.at + ((offset - self.at) // self.chunk + 1) * self.chunk, self.isolate_until
        )


class CrashGuard:
    """Per assigned partition: deaths so far, the isolation range, what to commit."""

    def __init__(self, max_crashes: int) -> None:
        if max_crashes < 1:
            raise ValueError(f"max_crashes must be ≥ 1, got {max_crashes}")
        self.max_crashes = max_crashes
        self._partitions: dict[Hashable, _Partition] = {}

    def assigned(
        self,
        tp: Hashable,
        committed: int | None,
        metadata: str | None,
        log_end: int | None = None,
    ) -> int:
        """Take over `tp` from its last commit; the deaths now pinned on `committed`. What was in
        flight when the last holder vanished (at most up to `log_end`, the partition's end) is
        isolated from now on."""
        state = parse(metadata)
        if committed is None or state is None or state.fetched <= committed:
            self._partitions.pop(tp, None)  # released cleanly, or nothing was in flight
            return 0
        # No record past the partition's end can have been in flight (`fetched` may count
        # some headroom past what was read).
        until = state.fetched if log_end is None else max(min(state.fetched, log_end), committed)
        if until <= committed:
            self._partitions.pop(tp, None)
            return 0
        suspects = until - committed
        ran_alone = state.alone or suspects == 1
        deaths = state.deaths + 1 if ran_alone else 0
        chunk = 1 if ran_alone else (suspects + 1) // 2
        self._partitions[tp] = _Partition(committed, deaths, until, chunk)
        return deaths

    def revoked(self, tp: Hashable) -> None:
        self._partitions.pop(tp, None)

    def metadata(self, tp: Hashable, offset: int, fetched: int) -> str:
        """What to commit with `offset` of `tp` while holding it (`fetched`: first unread)."""
        state = self._partitions.get(tp)
        deaths = state.deaths if state is not None and state.at == offset else 0
        end = self.chunk_end(tp, offset)
        if end is not None:  # isolating: what is in flight is the chunk, and only that
            return held(end, deaths, alone=end == offset + 1)
        return held(max(fetched, offset), deaths)

    def isolating(self, tp: Hashable, offset: int) -> bool:
        """Whether the record at `offset` is a suspect (it was in flight at a death)."""
        return self.chunk_end(tp, offset) is not None

    def chunk_end(self, tp: Hashable, offset: int) -> int | None:
        """Where the chunk that the suspect at `offset` runs in ends; None: not a suspect."""
        state = self._partitions.get(tp)
        if state is None or not state.at <= offset < state.isolate_until:
            return None
        return state.chunk_end(offset)

    def quarantined(self, tp: Hashable, offset: int) -> int | None:
        """The deaths of the record at `offset` when it is to be quarantined, else None."""
        state = self._partitions.get(tp)
        if state is not None and state.at == offset and state.deaths >= self.max_crashes:
            return state.deaths
        return None
