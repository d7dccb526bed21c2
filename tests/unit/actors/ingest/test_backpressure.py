"""Backpressure: pause above a high watermark, resume at or under both low ones, never flap."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.ingest.backpressure import Backpressure, Decision, Watermarks


def test_low_watermarks_default_to_half_the_high() -> None:
    marks = Watermarks(high_requests=10, high_tokens=1001)
    assert (marks.low_requests, marks.low_tokens) == (5, 500)
    assert (Watermarks().low_requests, Watermarks().low_tokens) == (256, 131072)


def test_explicit_low_watermarks_are_kept() -> None:
    marks = Watermarks(high_requests=10, high_tokens=100, low_requests=0, low_tokens=99)
    assert (marks.low_requests, marks.low_tokens) == (0, 99)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"high_requests": 0}, "high_requests"),
        ({"high_tokens": -1}, "high_tokens"),
        ({"high_requests": 10, "low_requests": 10}, "low_requests"),
        ({"high_requests": 10, "low_requests": 11}, "low_requests"),
        ({"high_requests": 10, "low_requests": -1}, "low_requests"),
        ({"high_tokens": 100, "low_tokens": 100}, "low_tokens"),
    ],
)
def test_bad_watermarks_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Watermarks(**kwargs)


def pressure(**kwargs: int) -> Backpressure:
    marks = {"high_requests": 10, "high_tokens": 100, "low_requests": 4, "low_tokens": 40}
    return Backpressure(Watermarks(**(marks | kwargs)))


def test_it_starts_unpaused_and_empty() -> None:
    bp = pressure()
    assert (bp.paused, bp.requests, bp.tokens) == (False, 0, 0)


def test_reaching_a_high_watermark_is_not_yet_passing_it() -> None:
    bp = pressure()
    assert bp.admit(10, 100) == Decision.NONE
    assert not bp.paused


def test_passing_the_request_watermark_pauses() -> None:
    bp = pressure()
    assert bp.admit(10, 10) == Decision.NONE
    assert bp.admit(1, 1) == Decision.PAUSE
    assert (bp.paused, bp.requests, bp.tokens) == (True, 11, 11)


def test_passing_the_token_watermark_alone_pauses() -> None:
    bp = pressure()
    assert bp.admit(1, 101) == Decision.PAUSE
    assert bp.paused


def test_admitting_more_while_paused_changes_nothing() -> None:
    bp = pressure()
    bp.admit(11, 0)
    assert bp.admit(5, 500) == Decision.NONE
    assert bp.paused


def test_it_resumes_only_once_both_counts_are_at_or_under_the_low_watermarks() -> None:
    bp = pressure()
    assert bp.admit(12, 90) == Decision.PAUSE
    assert bp.release(6, 10) == Decision.NONE  # 6 requests, 80 tokens: between the marks
    assert bp.release(2, 0) == Decision.NONE  # requests low, tokens not
    assert bp.paused
    assert bp.release(0, 40) == Decision.RESUME  # exactly at both low watermarks
    assert (bp.paused, bp.requests, bp.tokens) == (False, 4, 40)


def test_between_the_watermarks_it_does_not_flap() -> None:
    bp = pressure()
    bp.admit(11, 0)
    for _ in range(5):
        assert bp.release(5, 0) == Decision.NONE
        assert bp.admit(5, 0) == Decision.NONE
    assert bp.release(7, 0) == Decision.RESUME
    for _ in range(5):
        assert bp.admit(6, 0) == Decision.NONE
        assert bp.release(6, 0) == Decision.NONE
    assert not bp.paused


def test_releasing_when_not_paused_changes_nothing() -> None:
    bp = pressure()
    bp.admit(3, 30)
    assert bp.release(3, 30) == Decision.NONE
    assert (bp.requests, bp.tokens) == (0, 0)


@pytest.mark.parametrize(("requests", "tokens"), [(3, 0), (0, 31), (4, 40)])
def test_releasing_more_than_is_outstanding_is_refused(requests: int, tokens: int) -> None:
    bp = pressure()
    bp.admit(2, 30)
    with pytest.raises(ValueError, match="outstanding"):
        bp.release(requests, tokens)
    assert (bp.requests, bp.tokens) == (2, 30)


@pytest.mark.parametrize("method", ["admit", "release"])
def test_negative_amounts_are_refused(method: str) -> None:
    bp = pressure()
    bp.admit(5, 50)
    with pytest.raises(ValueError, match="negative"):
        getattr(bp, method)(-1, 0)
    with pytest.raises(ValueError, match="negative"):
        getattr(bp, method)(0, -1)
    assert (bp.requests, bp.tokens) == (5, 50)


marks_strategy = st.builds(
    lambda high_r, high_t, low_r, low_t: Watermarks(high_r, high_t, low_r % high_r, low_t % high_t),
    st.integers(1, 20),
    st.integers(1, 200),
    st.integers(0, 1000),
    st.integers(0, 1000),
)


@settings(max_examples=200, deadline=None)
@given(
    marks=marks_strategy,
    steps=st.lists(
        st.tuples(st.booleans(), st.integers(0, 8), st.integers(0, 80)), min_size=1, max_size=80
    ),
)
def test_hysteresis_over_any_sequence_of_admits_and_releases(
    marks: Watermarks, steps: list[tuple[bool, int, int]]
) -> None:
    bp = Backpressure(marks)
    assert marks.low_requests is not None and marks.low_tokens is not None
    requests = tokens = 0
    paused = False
    for admit, r, t in steps:
        if admit:
            decision = bp.admit(r, t)
            requests, tokens = requests + r, tokens + t
        else:
            r, t = min(r, requests), min(t, tokens)
            decision = bp.release(r, t)
            requests, tokens = requests - r, tokens - t
        above_high = requests > marks.high_requests or tokens > marks.high_tokens
        under_low = requests <= marks.low_requests and tokens <= marks.low_tokens
        if not paused and above_high:
            expected, paused = Decision.PAUSE, True
        elif paused and under_low:
            expected, paused = Decision.RESUME, False
        else:
            expected = Decision.NONE
        assert decision == expected
        assert (bp.paused, bp.requests, bp.tokens) == (paused, requests, tokens)
        assert bp.requests >= 0 and bp.tokens >= 0
        assert not bp.paused or not under_low
        assert bp.paused or not above_high


def test_room_is_what_is_left_under_the_high_watermark() -> None:
    bp = Backpressure(Watermarks(high_requests=10, high_tokens=1000))
    assert bp.room == 11
    bp.admit(4, 10)
    assert bp.room == 7
    bp.admit(10, 10)
    assert bp.room == 1  # never zero: the fetch loop always asks for at least one
