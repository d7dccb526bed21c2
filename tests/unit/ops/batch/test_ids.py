"""Fingerprints: a compact string set that answers like a `set[str]` before and after merging.

Recent additions live in a small set and are merged into a sorted array every `_MERGE_AT`;
membership, `len` and "already there" must not change across a merge.
"""

from __future__ import annotations

import tracemalloc
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ops.batch.ids import _MERGE_AT, Fingerprints, fingerprint

MANY = 70_000  # more than _MERGE_AT, so most keys sit in the sorted array


def filled(keys: list[str]) -> Fingerprints:
    fingerprints = Fingerprints()
    for key in keys:
        fingerprints.add(key)
    return fingerprints


def test_an_empty_set_holds_nothing() -> None:
    fingerprints = Fingerprints()
    assert len(fingerprints) == 0
    assert "" not in fingerprints
    assert "q1" not in fingerprints


def test_add_then_contains_and_len() -> None:
    fingerprints = Fingerprints()
    assert fingerprints.add("capital-france")
    assert fingerprints.add("haiku-kafka")
    assert "capital-france" in fingerprints
    assert "haiku-kafka" in fingerprints
    assert "explain-gpu" not in fingerprints
    assert len(fingerprints) == 2


def test_adding_a_duplicate_returns_false_and_changes_nothing() -> None:
    fingerprints = filled(["q1"])
    assert not fingerprints.add("q1")
    assert len(fingerprints) == 1
    assert "q1" in fingerprints


def test_similar_keys_are_distinct() -> None:
    # "\u00e9" and "e\u0301" render alike: keys are compared as given, not normalised
    keys = ["q1", "q1 ", "Q1", "q10", "", "\x00line:1", "\x00line:10", "\u00e9", "e\u0301"]
    fingerprints = filled(keys)
    assert len(fingerprints) == len(keys)
    assert all(key in fingerprints for key in keys)


def test_fingerprint_is_stable_and_64_bit() -> None:
    assert fingerprint("q1") == fingerprint("q1")
    assert fingerprint("q1") != fingerprint("q2")
    assert all(0 <= fingerprint(key) < 2**64 for key in ["", "q1", "x" * 10_000])


def test_many_keys_survive_the_merge_into_the_sorted_array() -> None:
    assert MANY > _MERGE_AT
    keys = [f"req-{i}" for i in range(MANY)]
    fingerprints = filled(keys)
    assert len(fingerprints) == MANY
    assert all(key in fingerprints for key in keys)
    absent = [f"req-{i}" for i in range(MANY, MANY + 2_000)] + [f"other-{i}" for i in range(2_000)]
    assert not any(key in fingerprints for key in absent)


def test_duplicates_are_refused_on_both_sides_of_a_merge() -> None:
    keys = [f"req-{i}" for i in range(MANY)]
    fingerprints = filled(keys)
    merged, recent = keys[0], keys[-1]  # added before and after the merge
    assert not fingerprints.add(merged)
    assert not fingerprints.add(recent)
    assert fingerprints.add("req-new")
    assert len(fingerprints) == MANY + 1


@pytest.mark.parametrize("merge_at", [_MERGE_AT, 3], ids=["default", "merge-every-3"])
@settings(max_examples=200, deadline=None, database=None)
@given(
    added=st.lists(st.text(max_size=8), max_size=40),
    probes=st.lists(st.text(max_size=8), max_size=20),
)
def test_answers_like_a_python_set(merge_at: int, added: list[str], probes: list[str]) -> None:
    with mock.patch("ops.batch.ids._MERGE_AT", merge_at):
        fingerprints, reference = Fingerprints(), set[str]()
        for key in added:
            assert fingerprints.add(key) == (key not in reference)
            reference.add(key)
            assert len(fingerprints) == len(reference)
        for key in added + probes:
            assert (key in fingerprints) == (key in reference)


def test_two_hundred_thousand_keys_take_a_small_part_of_a_python_sets_memory() -> None:
    keys = [f"request-{i:07d}" for i in range(200_000)]
    tracemalloc.start()
    try:
        fingerprints = Fingerprints()
        for key in keys:
            fingerprints.add(key)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # 8 bytes a key in the sorted array, plus at most one merge's worth of recent additions;
    # a set of these strings holds ~21 MB.
    assert held < 3 * 1024 * 1024, held
