"""The crash guard: deaths pinned on a record across workers, isolation, quarantine."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from actors.ingest.crash_guard import RELEASED, CrashGuard, Held, held, parse

TP = ("requests", 0)


def test_metadata_round_trips_and_foreign_metadata_means_nothing() -> None:
    assert parse(held(17, 2, alone=True)) == Held(17, 2, True)
    assert parse(held(17, 0)) == Held(17, 0, False)
    for foreign in ("", None, RELEASED, "someone else's", "tokenmill/1 held x 1 0",
                    "tokenmill/1 held 5 -1 0", "tokenmill/2 held 5 1 0",
                    "tokenmill/1 held 5 1 2", "tokenmill/1 held 5 1"):  # fmt: skip
        assert parse(foreign) is None


def test_a_clean_release_or_nothing_in_flight_pins_no_death() -> None:
    guard = CrashGuard(3)
    assert guard.assigned(TP, 10, RELEASED) == 0
    assert guard.assigned(TP, 10, held(10, 0)) == 0  # it had read nothing past its commit
    assert guard.assigned(TP, None, held(10, 0)) == 0  # never committed
    assert not guard.isolating(TP, 10)
    assert guard.metadata(TP, 10, 15) == held(15, 0)


def test_a_death_with_many_records_in_flight_pins_nothing_and_halves_them() -> None:
    guard = CrashGuard(1)
    assert guard.assigned(TP, 10, held(20, 0)) == 0  # read 10..19, died: which one did it?
    assert [guard.chunk_end(TP, o) for o in (9, 10, 14, 15, 19, 20)] == [None, 15, 15, 20, 20, None]
    assert guard.quarantined(TP, 10) is None
    # Before a chunk runs, the commit names it as what is in flight.
    assert parse(guard.metadata(TP, 10, 20)) == Held(15, 0, alone=False)
    assert parse(guard.metadata(TP, 15, 20)) == Held(20, 0, alone=False)
    assert parse(guard.metadata(TP, 20, 31)) == Held(31, 0, alone=False), "then as usual"


def test_each_death_halves_the_suspects_until_one_runs_alone_and_is_quarantined() -> None:
    metadata, ranges = held(18, 0), []  # worker 1 read offsets 10..17 and died
    for _ in range(3):
        guard = CrashGuard(2)
        assert guard.assigned(TP, 10, metadata) == 0
        metadata = guard.metadata(TP, 10, 18)  # the first chunk holds 10, the killer: it dies
        ranges.append(parse(metadata).fetched)  # type: ignore[union-attr]
    assert ranges == [14, 12, 11]
    assert parse(metadata) == Held(11, 0, alone=True)
    for death in (1, 2):
        guard = CrashGuard(2)
        assert guard.assigned(TP, 10, metadata) == death
        assert guard.chunk_end(TP, 10) == 11
        metadata = guard.metadata(TP, 10, 18)
    guard = CrashGuard(2)
    assert guard.assigned(TP, 10, metadata) == 3
    assert guard.quarantined(TP, 10) == 3
    assert guard.quarantined(TP, 11) is None


def test_no_suspect_lies_past_the_partitions_end() -> None:
    guard = CrashGuard(1)
    assert guard.assigned(TP, 10, held(600, 0), log_end=14) == 0  # 586 of headroom
    assert guard.chunk_end(TP, 10) == 12 and guard.chunk_end(TP, 14) is None
    assert CrashGuard(1).assigned(TP, 10, held(600, 0), log_end=11) == 1, "only one: alone"
    nothing = CrashGuard(1)
    assert nothing.assigned(TP, 10, held(600, 0), log_end=10) == 0
    assert not nothing.isolating(TP, 10)


def test_the_only_record_in_flight_counts_as_run_alone() -> None:
    assert CrashGuard(1).assigned(TP, 10, held(11, 0)) == 1


def test_progress_past_the_record_resets_its_count() -> None:
    guard = CrashGuard(2)
    guard.assigned(TP, 10, held(11, 1, alone=True))
    assert parse(guard.metadata(TP, 11, 20)) == Held(20, 0, False)  # 10 ran alone and passed
    # A death while 14 runs alone pins one death on 14, not on 10.
    next_worker = CrashGuard(2)
    assert next_worker.assigned(TP, 14, held(15, 0, alone=True)) == 1
    assert next_worker.quarantined(TP, 14) is None


def test_revoking_forgets_the_partition() -> None:
    guard = CrashGuard(1)
    guard.assigned(TP, 3, held(5, 0, alone=True))
    assert guard.quarantined(TP, 3) == 1
    guard.revoked(TP)
    assert guard.quarantined(TP, 3) is None and not guard.isolating(TP, 3)


def run_worker(guard: CrashGuard, committed: int, end: int, killer: int) -> tuple[int, str]:
    """A worker that runs its suspects chunk by chunk and dies running the killer: the
    offset and metadata it leaves committed."""
    metadata = guard.metadata(TP, committed, end)
    while True:
        chunk_end = guard.chunk_end(TP, committed)
        if chunk_end is None:
            chunk_end = end  # past the suspects: what is left runs together
        metadata = guard.metadata(TP, committed, end)  # written before the chunk runs
        if committed <= killer < chunk_end:
            return committed, metadata
        committed = chunk_end


@given(killer=st.integers(90, 109), max_crashes=st.integers(1, 4))
def test_a_record_that_kills_every_worker_is_quarantined_after_max_crashes(
    killer: int, max_crashes: int
) -> None:
    """Whoever runs the record at `killer` dies; the records around it are innocent."""
    # The first worker reads 90..109 and dies with 90 the oldest unfinished.
    committed, metadata, workers = 90, held(110, 0), 0
    while True:
        workers += 1
        guard = CrashGuard(max_crashes)
        guard.assigned(TP, committed, metadata)
        if guard.quarantined(TP, committed) is not None:
            assert committed == killer, "only the killer is quarantined"
            break
        committed, metadata = run_worker(guard, committed, 110, killer)
        # log2(20 suspects) halvings, then max_crashes deaths alone.
        assert workers <= 5 + max_crashes + 1
