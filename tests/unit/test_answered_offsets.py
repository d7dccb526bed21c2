"""The answered offsets kept in a commit's metadata (actors.transactions.answered)."""

from __future__ import annotations

import random

import pytest

from actors.ingest.crash_guard import held, parse
from actors.transactions.answered import (
    MAX_METADATA_CHARS,
    AnsweredOffsets,
    fits,
    join,
    split,
    take,
)


def test_ranges_merge_as_offsets_arrive_in_any_order() -> None:
    offsets = [5, 3, 4, 9, 7, 8, 12]
    answered = AnsweredOffsets(offsets)
    assert answered.ranges() == [(3, 5), (7, 9), (12, 12)]
    assert all(o in answered for o in offsets)
    assert 6 not in answered and 2 not in answered and 13 not in answered
    assert len(answered) == 7


def test_random_sets_round_trip_through_their_encoding() -> None:
    rng = random.Random(7)
    for _ in range(200):
        base = rng.randrange(0, 10_000)
        offsets = {base + rng.randrange(0, 300) for _ in range(rng.randrange(0, 80))}
        answered = AnsweredOffsets(rng.sample(sorted(offsets), len(offsets)))
        assert sorted(answered) == sorted(offsets)
        assert AnsweredOffsets.decode(answered.encode(base), base) == answered


def test_prune_below_forgets_what_the_commit_point_passed() -> None:
    answered = AnsweredOffsets([*range(10, 20), 25, 30])
    answered.prune_below(15)
    assert answered.ranges() == [(15, 19), (25, 25), (30, 30)]
    answered.prune_below(26)
    assert answered.ranges() == [(30, 30)]
    assert answered.encode(30) == "0"


def test_metadata_keeps_the_crash_guard_part_readable() -> None:
    guard = held(120, 1)
    metadata = join(guard, AnsweredOffsets([101, 102, 103, 110]), 100)
    assert metadata == f"{guard} answered 1-3,10"
    part, answered = split(metadata, 100)
    assert parse(part) == parse(guard)
    assert sorted(answered) == [101, 102, 103, 110]
    assert join(guard, AnsweredOffsets(), 100) == guard  # nothing answered: as before


@pytest.mark.parametrize(
    "metadata",
    [
        "tokenmill/1 held 5 0 0 answered x-1",
        "tokenmill/1 held 5 0 0 answered 3-1",
        "a answered 4,2",
    ],
)
def test_a_malformed_answered_part_counts_as_none(metadata: str) -> None:
    assert not split(metadata, 0)[1]


def test_an_unknown_base_reads_no_answers() -> None:
    assert not split("tokenmill/1 released answered 1-3", None)[1]


def test_fits_stops_before_kafkas_metadata_limit() -> None:
    answered = AnsweredOffsets(range(0, 20_000, 2))  # every other offset: one range each
    assert not fits(held(0, 0), answered, 0)
    small = AnsweredOffsets(range(0, 200, 2))
    assert fits(held(0, 0), small, 0)
    assert len(join(held(0, 0), small, 0)) <= MAX_METADATA_CHARS


def test_take_holds_back_what_would_not_fit_but_never_the_commit_point() -> None:
    base = 1000
    # every other offset above the commit point answered: one range each, the metadata full
    answered = AnsweredOffsets(range(base + 2, base + 20_000, 2))
    while not fits("g", answered, base):
        answered = AnsweredOffsets(list(answered)[:-50])
    answered = AnsweredOffsets(list(answered)[:-3])  # room for a few, not for RESERVE
    far = max(answered) + 2
    batch, written, full = take([base, far, far + 2], answered, "g", base)
    assert batch == [base] and full  # the commit point goes; the rest waits
    assert base in written and far not in written
    assert take([far], AnsweredOffsets(), "g", base) == ([far], AnsweredOffsets([far]), False)
    batch, written, full = take([base + 1], AnsweredOffsets([base - 5, base + 3]), "g", base)
    assert (batch, written.ranges(), full) == (
        [base + 1],
        [(base + 1, base + 1), (base + 3, base + 3)],
        False,
    )
