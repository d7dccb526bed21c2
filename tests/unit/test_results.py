"""Outcomes: refusals at the door (dead-lettered exactly when undecodable) and engine results."""

from __future__ import annotations

import time
from typing import Any

import pytest

from actors.mail import Admitted, Outcome, RecordRef
from actors.results import engine_outcome, finish_reason, rejected_at_door
from messages import headers as h
from messages.codec import JSON, MSGPACK
from messages.error_codes import DEAD_LETTER_CODES, ErrorCode
from messages.limits import MAX_ERROR_MESSAGE_CHARS
from messages.request import GenerateRequest
from messages.result import ErrorInfo, FinishReason, ModelRef, SourceRef

RECORD = RecordRef("tokenmill.requests", 3, 1041, timestamp_ms=1_767_225_600_000, key=b"k-1")
TRACEPARENT = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
HEADERS = [
    ("content-type", b"application/json"),
    ("traceparent", TRACEPARENT),
    ("x-team", b"search"),
    ("tracestate", b"vendor=1"),
]
MODEL = ModelRef(name="tiny-llama", digest="sha256:" + "ab" * 32)
DLQ_HEADERS = [
    h.DLQ_ERROR_CODE,
    h.DLQ_ERROR_MESSAGE,
    h.DLQ_SOURCE_TOPIC,
    h.DLQ_SOURCE_PARTITION,
    h.DLQ_SOURCE_OFFSET,
]


def reject(code: ErrorCode, message: str = "why it was refused", **kw: Any) -> Outcome:
    args: dict[str, Any] = {
        "request_id": "req-1",
        "reply_topic": "team.replies",
        "content_type": JSON,
        "worker": "w1",
        "value": b"{x",
        "headers": HEADERS,
    }
    return rejected_at_door(RECORD, code, message, **{**args, **kw})


@pytest.mark.parametrize("code", list(ErrorCode), ids=str)
def test_dead_lettered_exactly_when_undecodable(code: ErrorCode) -> None:
    outcome = reject(code)
    assert (outcome.dead_letter is not None) == (code in DEAD_LETTER_CODES)
    result = outcome.result
    assert result.error == ErrorInfo(code=code, message="why it was refused")
    assert result.finish_reason is FinishReason.ERROR
    assert not result.ok
    assert (result.id, result.worker) == ("req-1", "w1")
    assert result.source == SourceRef(topic="tokenmill.requests", partition=3, offset=1041)
    assert (result.text, result.token_ids, result.model) == ("", [], None)
    assert outcome.record == RECORD
    assert (outcome.reply_topic, outcome.content_type) == ("team.replies", JSON)
    assert not outcome.admitted and outcome.cost_tokens == 0


def test_the_dead_letter_keeps_the_record_and_says_why() -> None:
    outcome = reject(ErrorCode.INVALID_JSON, "cannot decode the request: JSON is malformed")
    letter = outcome.dead_letter
    assert letter is not None
    assert (letter.key, letter.value) == (b"k-1", b"{x")
    assert letter.headers[: len(HEADERS)] == HEADERS  # the original headers, untouched, first
    added = letter.headers[len(HEADERS) :]
    assert [name for name, _ in added] == DLQ_HEADERS
    assert dict(added) == {
        "tokenmill-error-code": b"invalid_json",
        "tokenmill-error-message": b"cannot decode the request: JSON is malformed",
        "tokenmill-source-topic": b"tokenmill.requests",
        "tokenmill-source-partition": b"3",
        "tokenmill-source-offset": b"1041",
    }


def test_a_tombstone_is_dead_lettered_with_an_empty_value() -> None:
    # Kafka refuses a record with neither key nor value, so a null value becomes b"".
    letter = reject(ErrorCode.INVALID_JSON, value=None).dead_letter
    assert letter is not None and letter.value == b""


def test_a_long_message_is_cut_to_the_limit_in_the_result_and_the_dlq_header() -> None:
    message = "x" * 5000
    outcome = reject(ErrorCode.SCHEMA_VIOLATION, message)
    assert outcome.result.error is not None
    assert outcome.result.error.message == "x" * (MAX_ERROR_MESSAGE_CHARS - 1) + "…"
    assert outcome.dead_letter is not None
    assert h.header(outcome.dead_letter.headers, h.DLQ_ERROR_MESSAGE) == b"x" * 1024


def test_trace_headers_are_carried_and_nothing_else() -> None:
    outcome = reject(ErrorCode.PROMPT_TOO_LONG)
    assert outcome.trace == [("traceparent", TRACEPARENT), ("tracestate", b"vendor=1")]
    assert reject(ErrorCode.INVALID_JSON, headers=[]).trace == []


def test_metadata_is_echoed() -> None:
    outcome = reject(ErrorCode.INVALID_MAX_TOKENS, metadata={"row": "17"})
    assert outcome.result.metadata == {"row": "17"}
    assert reject(ErrorCode.INVALID_MAX_TOKENS).result.metadata == {}


def test_a_lost_id_is_kept_as_given() -> None:
    outcome = reject(ErrorCode.MISSING_ID, request_id="", content_type=MSGPACK)
    assert outcome.result.id == ""
    assert outcome.content_type == MSGPACK


# --- engine outcomes -------------------------------------------------------------------------


def admitted(prompt_tokens: int = 5, **fields: Any) -> Admitted:
    request = GenerateRequest(id="req-9", prompt="x", max_new_tokens=8, **fields)
    return Admitted(
        request=request,
        record=RECORD,
        prompt_token_ids=list(range(prompt_tokens)),
        reply_topic="team.replies",
        content_type=MSGPACK,
        trace=[("traceparent", TRACEPARENT)],
        consumed_at=time.monotonic() - 0.25,
        deadline=None,
    )


def finished(item: Admitted, reason: str, token_ids: list[int], **kw: Any) -> Outcome:
    args: dict[str, Any] = {
        "text": "abc",
        "token_ids": token_ids,
        "reason": reason,
        "model": MODEL,
        "worker": "w1",
        "queued_ms": 1.5,
        "ttft_ms": 20.0,
        "tpot_ms": 5.0,
    }
    return engine_outcome(item, **{**args, **kw})


def test_engine_outcome_usage_and_timings() -> None:
    item = admitted(prompt_tokens=5, metadata={"row": "1"})
    outcome = finished(item, "length", [10, 11, 12])
    result = outcome.result
    assert result.ok and result.finish_reason is FinishReason.LENGTH
    assert (result.usage.prompt_tokens, result.usage.completion_tokens) == (5, 3)
    assert result.usage.total_tokens == 8
    assert (result.id, result.text, result.token_ids) == ("req-9", "abc", [10, 11, 12])
    assert (result.model, result.worker, result.metadata) == (MODEL, "w1", {"row": "1"})
    assert (result.timings.queued_ms, result.timings.ttft_ms, result.timings.tpot_ms) == (
        1.5,
        20.0,
        5.0,
    )
    assert 250 <= result.timings.total_ms < 60_000  # consumed 0.25 s ago
    assert result.source == RECORD.source()
    assert outcome.admitted and outcome.cost_tokens == 5 + 8
    assert outcome.trace == item.trace
    assert (outcome.reply_topic, outcome.content_type) == ("team.replies", MSGPACK)
    assert outcome.dead_letter is None


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        ("stop", FinishReason.STOP),
        ("length", FinishReason.LENGTH),
        ("cancelled", FinishReason.CANCELLED),
        ("deadline", FinishReason.DEADLINE),
        ("shutting_down", FinishReason.ERROR),
        ("error", FinishReason.ERROR),
        ("something_new", FinishReason.ERROR),
    ],
)
def test_finish_reasons(reason: str, expected: FinishReason) -> None:
    assert finish_reason(reason) is expected
    assert finished(admitted(), reason, [1]).result.finish_reason is expected


def test_an_aborted_request_carries_its_error() -> None:
    late = ErrorInfo(code=ErrorCode.DEADLINE_EXCEEDED, message="the deadline passed")
    result = finished(admitted(), "deadline", [1, 2], error=late).result
    assert result.finish_reason is FinishReason.DEADLINE
    assert result.error == late and not result.ok
    assert result.usage.completion_tokens == 2  # what it produced before the abort
    down = ErrorInfo(code=ErrorCode.SHUTTING_DOWN, message="the worker shut down")
    stopped = finished(admitted(), "shutting_down", [], error=down).result
    assert stopped.finish_reason is FinishReason.ERROR
    assert stopped.error == down


def test_an_engine_refusal_has_no_completion() -> None:
    error = ErrorInfo(code=ErrorCode.ENGINE_ERROR, message="out of KV blocks")
    result = finished(admitted(prompt_tokens=3), "error", [], text="", error=error).result
    assert result.finish_reason is FinishReason.ERROR
    assert (result.text, result.token_ids) == ("", [])
    assert (result.usage.prompt_tokens, result.usage.completion_tokens) == (3, 0)
