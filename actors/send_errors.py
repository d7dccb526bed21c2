"""What a failed send means: wait for the broker, answer the record instead, or give up.

Kafka's own split (an error's `retriable` flag) decides most of it; the records a broker
refuses for good are told apart from a producer that is broken, because only the former are
the record's fault and may be answered with an error result instead of being sent again.
"""

from __future__ import annotations

import enum
import random

from aiokafka import errors as kafka

from messages.error_codes import ErrorCode


class UndeliveredResult(Exception):
    """Marks a request's spans: its result was refused and answered with an error instead."""

    def __init__(self, code: ErrorCode) -> None:
        super().__init__(code.value)
        self.code = code


class DeadLetterBlocked(Exception):
    """Marks a request's spans: its dead letter was refused until the worker stopped, so it
    was never reported delivered (its record is read again)."""

    def __init__(self, topic: str) -> None:
        super().__init__(f"the dead-letter topic {topic!r} refused it")
        self.topic = topic


class ProducerBroken(Exception):
    """The emitter's producer cannot go on (a `BROKEN` verdict): it is replaced by a new one."""


class Verdict(enum.Enum):
    RETRY = "retry"  # the broker is away or busy: send it again after a backoff
    REFUSED = "refused"  # the broker will never take this record: answer it instead
    BROKEN = "broken"  # the producer itself is unusable: a new one sends it again


_TOO_LARGE = (kafka.MessageSizeTooLargeError, kafka.RecordListTooLargeError)
_REFUSED = (
    *_TOO_LARGE,
    kafka.TopicAuthorizationFailedError,
    kafka.InvalidTopicError,
    kafka.UnknownTopicOrPartitionError,  # retriable to Kafka, but auto-create is off here
    kafka.PolicyViolationError,
    kafka.CorruptRecordException,
)


def verdict(exc: BaseException) -> Verdict:
    if isinstance(exc, _REFUSED):
        return Verdict.REFUSED
    if isinstance(exc, kafka.KafkaError) and exc.retriable:
        return Verdict.RETRY
    if isinstance(exc, kafka.KafkaTimeoutError | kafka.KafkaConnectionError | OSError):
        return Verdict.RETRY
    return Verdict.BROKEN


def refusal_code(exc: BaseException) -> ErrorCode:
    """The error code of a result whose record the broker refused with `exc`."""
    return ErrorCode.RESULT_TOO_LARGE if isinstance(exc, _TOO_LARGE) else ErrorCode.REPLY_TO_REFUSED


def backoff_s(attempt: int, *, first_s: float = 0.2, cap_s: float = 10.0) -> float:
    """Exponential with full jitter: a fleet of workers does not knock on the broker at once."""
    return random.uniform(first_s / 2, min(cap_s, first_s * 2**attempt))
