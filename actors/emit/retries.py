"""Whether a failed request is answered, retried or dead-lettered: a pure decision.

    step = next_step(code, attempt, max_attempts, retries_usable=True)
    Step.ANSWER        its result goes out as it is (a success, or a failure no retry mends)
    Step.RETRY         the request goes to `<requests topic>.retry.<attempt>`, no result yet
    Step.DEAD_LETTER   its last attempt failed: its error result, and the request to the DLQ

Only the worker's own transient failures are retried: an engine error (`engine_error`) and a
deadline missed while draining (`shutting_down`). A request that breaks a rule fails the
same way every time and is never retried. A worker that dies with a request is the crash
guard's case: its record is read again in place, and its deaths count as attempts in the
history of the record it quarantines (`actors.ingest.refusals`).
"""

from __future__ import annotations

import enum

from messages.error_codes import ErrorCode

TRANSIENT_CODES = frozenset({ErrorCode.ENGINE_ERROR, ErrorCode.SHUTTING_DOWN})


class Step(enum.Enum):
    ANSWER = "answer"
    RETRY = "retry"
    DEAD_LETTER = "dead_letter"


def next_step(
    code: ErrorCode | None, attempt: int, max_attempts: int, *, retries_usable: bool
) -> Step:
    """What follows attempt `attempt` of a request that ended with `code` (None: it did not
    fail). `retries_usable`: the retry topics exist (else a transient failure is
    dead-lettered at once)."""
    if code not in TRANSIENT_CODES:
        return Step.ANSWER
    if attempt < max_attempts and retries_usable:
        return Step.RETRY
    return Step.DEAD_LETTER


def backoff_ms(first_ms: float, failed_attempt: int) -> int:
    """How long the retry after `failed_attempt` waits: `first_ms`, doubled for each retry
    before it."""
    return int(first_ms * 2 ** max(failed_attempt - 1, 0))
