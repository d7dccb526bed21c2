"""A record's attempt headers: read leniently, written back as they were read."""

from __future__ import annotations

from messages import headers as h
from messages.attempts import (
    MAX_HISTORY,
    Attempts,
    failed_attempt,
    not_before_ms,
    read_attempts,
    rfc3339,
    without_attempt_headers,
)


def test_a_record_without_attempt_headers_is_the_first_attempt() -> None:
    assert read_attempts([(h.CONTENT_TYPE, b"application/json")]) == Attempts(1, (), None)
    assert read_attempts(None) == Attempts()


def test_the_headers_of_an_attempt_read_back_as_it() -> None:
    entry = failed_attempt(1, worker="w-1", code="engine_error", message="boom", at_s=1.5)
    attempts = Attempts(2, (entry,), 1_700_000_000_123)
    headers = attempts.headers()
    assert headers[0] == (h.ATTEMPT, b"2")
    assert (h.NOT_BEFORE, b"1700000000123") in headers
    assert read_attempts(headers) == attempts
    assert entry.time == "1970-01-01T00:00:01.500Z"


def test_garbled_headers_count_as_absent() -> None:
    garbled = [(h.ATTEMPT, b"two"), (h.ATTEMPT_HISTORY, b"{not json"), (h.NOT_BEFORE, b"-5")]
    assert read_attempts(garbled) == Attempts()
    assert read_attempts([(h.ATTEMPT, b"0")]).number == 1
    assert not_before_ms([(h.NOT_BEFORE, b"\xff")]) is None


def test_a_failed_attempt_moves_to_the_next_with_it_in_the_history() -> None:
    first = failed_attempt(1, worker="w", code="engine_error", message="x" * 10_000)
    after = Attempts().failed(first)
    assert after.number == 2 and after.history == (first,) and after.not_before_ms is None
    assert len(first.message) == 256, "messages are cut"


def test_the_history_keeps_only_its_newest_entries() -> None:
    attempts = Attempts()
    for n in range(1, MAX_HISTORY + 5):
        attempts = attempts.failed(failed_attempt(n, worker="w", code="engine_error", message=""))
    assert len(attempts.history) == MAX_HISTORY
    assert attempts.history[-1].attempt == MAX_HISTORY + 4
    assert read_attempts(attempts.headers()) == attempts


def test_attempt_headers_are_taken_off_before_new_ones_are_written() -> None:
    headers = [(h.TRACEPARENT, b"t"), (h.ATTEMPT, b"2"), ("Tokenmill-Not-Before", b"9")]
    assert without_attempt_headers(headers) == [(h.TRACEPARENT, b"t")]


def test_times_are_rfc3339_in_utc_with_milliseconds() -> None:
    assert rfc3339(1_796_382_902.125) == "2026-12-04T11:15:02.125Z"
