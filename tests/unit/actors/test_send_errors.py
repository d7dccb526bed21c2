"""What a failed send means to the emitter."""

from __future__ import annotations

import pytest
from aiokafka import errors as kafka

from actors.send_errors import Verdict, backoff_s, refusal_code, verdict
from messages.error_codes import ErrorCode


@pytest.mark.parametrize(
    "exc",
    [
        kafka.KafkaTimeoutError(),
        kafka.KafkaConnectionError(),
        kafka.NotLeaderForPartitionError(),
        kafka.RequestTimedOutError(),
        kafka.NotEnoughReplicasError(),
        kafka.LeaderNotAvailableError(),
    ],
)
def test_a_broker_away_or_busy_is_retried(exc: Exception) -> None:
    assert verdict(exc) is Verdict.RETRY


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (kafka.MessageSizeTooLargeError(), ErrorCode.RESULT_TOO_LARGE),
        (kafka.RecordListTooLargeError(), ErrorCode.RESULT_TOO_LARGE),
        (kafka.TopicAuthorizationFailedError(), ErrorCode.REPLY_TO_REFUSED),
        (kafka.UnknownTopicOrPartitionError(), ErrorCode.REPLY_TO_REFUSED),
        (kafka.InvalidTopicError(), ErrorCode.REPLY_TO_REFUSED),
        (kafka.PolicyViolationError(), ErrorCode.REPLY_TO_REFUSED),
    ],
)
def test_a_record_refused_for_good_is_answered_instead(exc: Exception, code: ErrorCode) -> None:
    assert verdict(exc) is Verdict.REFUSED
    assert refusal_code(exc) is code


@pytest.mark.parametrize(
    "exc", [kafka.OutOfOrderSequenceNumber(), kafka.ProducerFenced(), RuntimeError("bug")]
)
def test_a_broken_producer_is_neither_retried_nor_blamed_on_the_record(exc: Exception) -> None:
    assert verdict(exc) is Verdict.BROKEN


def test_backoff_grows_to_its_cap_with_jitter() -> None:
    assert all(0.1 <= backoff_s(0) <= 0.2 for _ in range(50))
    assert all(0.1 <= backoff_s(30) <= 10.0 for _ in range(50))
    assert max(backoff_s(30) for _ in range(200)) > 2.0
