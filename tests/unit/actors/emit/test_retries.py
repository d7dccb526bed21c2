"""The retry decision: transient failures are retried until the last attempt, then
dead-lettered; every other answer goes out as it is."""

from __future__ import annotations

import pytest

from actors.emit.retries import Step, backoff_ms, next_step
from messages.error_codes import ErrorCode


@pytest.mark.parametrize("code", [ErrorCode.ENGINE_ERROR, ErrorCode.SHUTTING_DOWN])
def test_a_transient_failure_is_retried_until_the_last_attempt(code: ErrorCode) -> None:
    assert next_step(code, 1, 3, retries_usable=True) is Step.RETRY
    assert next_step(code, 2, 3, retries_usable=True) is Step.RETRY
    assert next_step(code, 3, 3, retries_usable=True) is Step.DEAD_LETTER
    assert next_step(code, 7, 3, retries_usable=True) is Step.DEAD_LETTER


@pytest.mark.parametrize(
    "code",
    [None, ErrorCode.SCHEMA_VIOLATION, ErrorCode.PROMPT_TOO_LONG, ErrorCode.DEADLINE_EXCEEDED,
     ErrorCode.QUARANTINED, ErrorCode.RESULT_TOO_LARGE, ErrorCode.DUPLICATE_REQUEST],
)  # fmt: skip
def test_successes_and_failures_no_retry_mends_are_answered(code: ErrorCode | None) -> None:
    assert next_step(code, 1, 3, retries_usable=True) is Step.ANSWER


def test_without_retry_topics_a_transient_failure_is_dead_lettered_at_once() -> None:
    assert next_step(ErrorCode.ENGINE_ERROR, 1, 3, retries_usable=False) is Step.DEAD_LETTER


def test_one_attempt_means_no_retries() -> None:
    assert next_step(ErrorCode.ENGINE_ERROR, 1, 1, retries_usable=True) is Step.DEAD_LETTER


def test_the_backoff_doubles_with_each_retry() -> None:
    assert [backoff_ms(500, n) for n in (1, 2, 3)] == [500, 1000, 2000]
    assert backoff_ms(0, 4) == 0
