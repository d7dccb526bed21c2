"""An outcome's records: its result within the producer's limit, else an error result on the
results topic and the request to the DLQ (`result_too_large`)."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any, cast

from actors.config import DEAD_LETTER_ROOM, WorkerConfig
from actors.emit.planning import OutcomePlanner
from actors.emit.records import Pending
from actors.mail import Outcome, RecordRef
from messages import headers as h
from messages.attempts import Attempts, failed_attempt, read_attempts
from messages.codec import JSON, Codec
from messages.error_codes import ErrorCode
from messages.limits import MAX_KEY_BYTES
from messages.request import GenerateRequest
from messages.result import ErrorInfo, GenerateResult

RECORD = RecordRef("lane.requests", 0, 17, 0, key=b"record-key")
CONFIG = WorkerConfig(
    results_topic="lane.results",
    dlq_topic="lane.dlq",
    max_request_bytes=4096,
    max_message_bytes=4096 + DEAD_LETTER_ROOM,
)
TRACE = [(h.TRACEPARENT, b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")]


def pending(text: str, request_id: str = "r-1") -> Pending:
    request = GenerateRequest(id=request_id, prompt_token_ids=[5], max_new_tokens=2)
    outcome = Outcome(
        record=RECORD,
        result=GenerateResult(id=request_id, text=text, metadata={"team": "search"}),
        reply_topic="lane.replies",
        content_type=JSON,
        request=request,
    )
    spans = SimpleNamespace(headers=TRACE)  # the request's spans: only their headers are read
    return Pending(outcome, cast(Any, spans), [], [])


def planner() -> tuple[OutcomePlanner, list[str]]:
    counted: list[str] = []
    return OutcomePlanner(count=counted.append), counted


def test_a_result_within_the_limit_is_one_record_keyed_by_its_id() -> None:
    plan, counted = planner()
    p = pending("hello")
    plan.plan(p, CONFIG)
    [result] = p.records
    assert (result.topic, result.key, result.is_result) == ("lane.replies", b"r-1", True)
    assert list(result.headers) == [
        *TRACE,
        (h.CONTENT_TYPE, JSON.encode()),
        (h.SCHEMA, h.RESULT_SCHEMA.encode()),
    ]
    assert Codec(GenerateResult).decode(result.value, JSON).text == "hello"
    assert p.answered is None and plan.answered_instead == 0 and counted == []


def test_a_result_over_the_producers_limit_is_answered_with_an_error_and_a_dead_letter() -> None:
    plan, counted = planner()
    p = pending("x" * (CONFIG.producer_max_bytes + 1))
    plan.plan(p, CONFIG)
    result, letter = p.records
    assert p.answered is ErrorCode.RESULT_TOO_LARGE
    assert result.topic == "lane.results" and result.size <= CONFIG.producer_max_bytes
    answer = Codec(GenerateResult).decode(result.value, JSON)
    assert answer.id == "r-1" and answer.error is not None
    assert answer.error.code is ErrorCode.RESULT_TOO_LARGE
    assert answer.text == "" and answer.metadata == {}, "small by construction"
    assert (letter.topic, letter.is_result) == ("lane.dlq", False)
    request = Codec(GenerateRequest).decode(letter.value, JSON)
    assert request.id == "r-1", "the dead letter carries the request"
    assert plan.answered_instead == 1 and counted == ["answered"]


def test_an_answer_is_planned_once_even_if_it_is_still_too_large() -> None:
    plan, _ = planner()
    p = pending("small")
    p.answered = ErrorCode.REPLY_TO_REFUSED  # answered already: never answered twice
    plan.plan(p, CONFIG)
    assert [r.topic for r in p.records] == ["lane.replies"]


def test_a_key_over_the_kafka_key_limit_is_left_out() -> None:
    plan, _ = planner()
    p = pending("hello", request_id="k" * (MAX_KEY_BYTES + 1))
    plan.plan(p, CONFIG)
    assert p.records[0].key is None


def test_a_result_without_an_id_is_keyed_by_its_records_key() -> None:
    plan, _ = planner()
    p = pending("hello", request_id="")
    plan.plan(p, CONFIG)
    assert p.records[0].key == b"record-key"


# -- retries (actors.emit.retries) ---------------------------------------------------------


def failed(code: ErrorCode, attempts: Attempts | None = None) -> Pending:
    p = pending("")
    p.outcome.result = GenerateResult(
        id="r-1", worker="w-1", error=ErrorInfo(code=code, message="boom")
    )
    p.outcome.admitted = True
    p.outcome.attempts = attempts or Attempts()
    return p


def test_a_transient_failure_before_the_last_attempt_is_only_its_retry() -> None:
    plan = OutcomePlanner(count=list[str]().append, retries_usable=True)
    p = failed(ErrorCode.ENGINE_ERROR)
    before_ms = int(time.time() * 1000)
    plan.plan(p, CONFIG)
    [retry] = p.records
    assert p.retried and retry.is_retry and not retry.is_result
    assert retry.topic == "tokenmill.requests.retry.1"
    assert retry.key == b"record-key", "its record's key: the same partition order"
    assert Codec(GenerateRequest).decode(retry.value, JSON).id == "r-1"
    attempts = read_attempts(retry.headers)
    assert attempts.number == 2
    [entry] = attempts.history
    assert (entry.attempt, entry.worker, entry.code, entry.message) == (
        1, "w-1", "engine_error", "boom"
    )  # fmt: skip
    assert attempts.not_before_ms is not None
    assert attempts.not_before_ms >= before_ms + CONFIG.retry_backoff_ms
    assert h.header(retry.headers, h.TRACEPARENT) == TRACE[0][1]


def test_the_second_retry_goes_to_the_second_retry_topic_after_twice_the_backoff() -> None:
    plan = OutcomePlanner(count=list[str]().append, retries_usable=True)
    first = failed_attempt(1, worker="w-0", code="engine_error", message="first")
    p = failed(ErrorCode.SHUTTING_DOWN, Attempts(2, (first,)))
    plan.plan(p, CONFIG)
    [retry] = p.records
    attempts = read_attempts(retry.headers)
    assert retry.topic == "tokenmill.requests.retry.2" and attempts.number == 3
    assert [e.code for e in attempts.history] == ["engine_error", "shutting_down"]
    assert attempts.not_before_ms is not None
    assert attempts.not_before_ms >= time.time() * 1000 + CONFIG.retry_backoff_ms


def test_after_the_last_attempt_the_error_result_and_a_dead_letter_with_the_history() -> None:
    plan = OutcomePlanner(count=list[str]().append, retries_usable=True)
    history = tuple(failed_attempt(n, worker="w", code="engine_error", message="e") for n in (1, 2))
    p = failed(ErrorCode.ENGINE_ERROR, Attempts(3, history))
    plan.plan(p, CONFIG)
    result, letter = p.records
    assert result.is_result and not p.retried
    assert h.header(result.headers, h.ATTEMPT) == b"3", "the result names its attempt"
    answer = Codec(GenerateResult).decode(result.value, JSON)
    assert answer.error is not None and answer.error.code is ErrorCode.ENGINE_ERROR
    assert letter.is_dead_letter and letter.topic == "lane.dlq"
    attempts = read_attempts(letter.headers)
    assert attempts.number == 3 and [e.attempt for e in attempts.history] == [1, 2, 3]
    assert h.header(letter.headers, h.DLQ_ERROR_CODE) == b"engine_error"
    assert Codec(GenerateRequest).decode(letter.value, JSON).id == "r-1"


def test_without_usable_retry_topics_a_transient_failure_is_dead_lettered_at_once() -> None:
    plan = OutcomePlanner(count=list[str]().append, retries_usable=False)
    p = failed(ErrorCode.ENGINE_ERROR)
    plan.plan(p, CONFIG)
    assert [r.kind for r in p.records] == ["result", "dead_letter"]


def test_validation_errors_and_refusals_at_the_door_are_never_retried() -> None:
    plan = OutcomePlanner(count=list[str]().append, retries_usable=True)
    p = failed(ErrorCode.PROMPT_TOO_LONG)
    plan.plan(p, CONFIG)
    assert [r.kind for r in p.records] == ["result"]
    door = failed(ErrorCode.ENGINE_ERROR)
    door.outcome.admitted = False  # answered at the door: never ran
    plan.plan(door, CONFIG)
    assert [r.kind for r in door.records] == ["result"]


def test_a_refused_retry_is_dead_lettered_with_its_error_result() -> None:
    counted: list[str] = []
    plan = OutcomePlanner(count=counted.append, retries_usable=True)
    p = failed(ErrorCode.ENGINE_ERROR)
    plan.plan(p, CONFIG)
    plan.retry_refused(p, RuntimeError("topic gone"), CONFIG)
    assert [r.kind for r in p.records] == ["result", "dead_letter"]
    assert counted == ["retry_refused"]
    assert [e.code for e in read_attempts(p.records[1].headers).history] == ["engine_error"]
