"""Outcomes: refusals at the door (dead-lettered exactly when undecodable) and engine results."""

from __future__ import annotations

import time
from typing import Any

import pytest

from actors.config import DEAD_LETTER_HEADER_BYTES
from actors.mail import Admitted, Outcome, RecordRef
from actors.results import (
    cancelled_before_engine,
    engine_outcome,
    finish_reason,
    rejected_at_door,
    undeliverable,
    unrun_outcome,
)
from actors.telemetry.trace_context import TraceContext
from gpu.engine_io import Completion
from gpu.logprobs import CompletionLogprobs
from messages import headers as h
from messages.codec import JSON, MSGPACK
from messages.error_codes import DEAD_LETTER_CODES, ErrorCode
from messages.limits import MAX_ERROR_MESSAGE_CHARS
from messages.request import GenerateRequest
from messages.result import (
    Choice,
    ErrorInfo,
    FinishReason,
    ModelRef,
    SourceRef,
    TokenLogprobs,
    Usage,
)

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
    # Kafka Connect's, as its DeadLetterQueueReporter names them.
    "__connect.errors.topic",
    "__connect.errors.partition",
    "__connect.errors.offset",
    "__connect.errors.connector.name",
    "__connect.errors.task.id",
    "__connect.errors.stage",
    "__connect.errors.exception.class.name",
    "__connect.errors.exception.message",
]
# The stage of Connect's pipeline each dead-lettered refusal is reported in.
STAGES = {
    ErrorCode.INVALID_ENCODING: b"VALUE_CONVERTER",
    ErrorCode.INVALID_JSON: b"VALUE_CONVERTER",
    ErrorCode.MESSAGE_TOO_LARGE: b"VALUE_CONVERTER",
    ErrorCode.UNSUPPORTED_CONTENT_TYPE: b"VALUE_CONVERTER",
    ErrorCode.SCHEMA_VIOLATION: b"VALUE_CONVERTER",
    ErrorCode.MISSING_ID: b"VALUE_CONVERTER",
    ErrorCode.ID_TOO_LONG: b"VALUE_CONVERTER",
    ErrorCode.KEY_TOO_LARGE: b"KEY_CONVERTER",
    ErrorCode.QUARANTINED: b"TASK_PUT",
    ErrorCode.UNREADABLE_RECORD: b"KAFKA_CONSUME",
}


def reject(code: ErrorCode, message: str = "why it was refused", **kw: Any) -> Outcome:
    args: dict[str, Any] = {
        "request_id": "req-1",
        "reply_topic": "team.replies",
        "content_type": JSON,
        "worker": "w1",
        "value": b"{x",
        "headers": HEADERS,
    }
    args = {**args, **kw}
    args.setdefault("trace", TraceContext.of(args["headers"]))  # as the door's envelope reads it
    return rejected_at_door(RECORD, code, message, **args)


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
        "__connect.errors.topic": b"tokenmill.requests",
        "__connect.errors.partition": b"3",
        "__connect.errors.offset": b"1041",
        "__connect.errors.connector.name": b"tokenmill",
        "__connect.errors.task.id": b"w1",
        "__connect.errors.stage": b"VALUE_CONVERTER",
        "__connect.errors.exception.class.name": b"tokenmill.errors.InvalidJson",
        "__connect.errors.exception.message": b"cannot decode the request: JSON is malformed",
    }


def test_every_dead_letter_code_has_its_connect_stage() -> None:
    assert set(STAGES) == DEAD_LETTER_CODES


@pytest.mark.parametrize("code", sorted(DEAD_LETTER_CODES), ids=str)
def test_each_dead_letter_carries_connects_error_context_beside_tokenmills(
    code: ErrorCode,
) -> None:
    letter = reject(code, "refused: " + code.value, worker="host-7-4242").dead_letter
    assert letter is not None
    names = dict(letter.headers)
    assert names[h.DLQ_ERROR_CODE] == code.value.encode()
    for ours, connects in [
        (h.DLQ_SOURCE_TOPIC, h.CONNECT_TOPIC),
        (h.DLQ_SOURCE_PARTITION, h.CONNECT_PARTITION),
        (h.DLQ_SOURCE_OFFSET, h.CONNECT_OFFSET),
        (h.DLQ_ERROR_MESSAGE, h.CONNECT_EXCEPTION_MESSAGE),
    ]:
        assert names[connects] == names[ours], connects
    assert (names[h.CONNECT_TOPIC], names[h.CONNECT_PARTITION], names[h.CONNECT_OFFSET]) == (
        b"tokenmill.requests",
        b"3",
        b"1041",
    )
    assert names[h.CONNECT_EXCEPTION_MESSAGE] == b"refused: " + code.value.encode()
    assert names[h.CONNECT_EXCEPTION] == h.connect_exception_class(code).encode()
    assert names[h.CONNECT_STAGE] == STAGES[code]
    assert names[h.CONNECT_CONNECTOR_NAME] == b"tokenmill"
    assert names[h.CONNECT_TASK_ID] == b"host-7-4242"
    assert [n for n, _ in letter.headers].count(h.CONNECT_STAGE) == 1


def test_connect_exception_class_names() -> None:
    assert h.connect_exception_class(ErrorCode.MESSAGE_TOO_LARGE) == (
        "tokenmill.errors.MessageTooLarge"
    )
    assert h.connect_exception_class(ErrorCode.ID_TOO_LONG) == "tokenmill.errors.IdTooLong"
    names = {h.connect_exception_class(code) for code in ErrorCode}
    assert len(names) == len(ErrorCode), "one name per code"
    assert all(name.removeprefix("tokenmill.errors.").isidentifier() for name in names)


@pytest.mark.parametrize("code", [ErrorCode.RESULT_TOO_LARGE, ErrorCode.REPLY_TO_REFUSED])
def test_an_undeliverable_result_is_dead_lettered_at_the_produce_stage(code: ErrorCode) -> None:
    ran = finished(admitted(), "stop", [1, 2])
    outcome = undeliverable(ran, code, "team.replies: refused", results_topic="r", value=b"{}")
    letter = outcome.dead_letter
    assert letter is not None and letter.value == b"{}"
    names = dict(letter.headers)
    assert [n for n, _ in letter.headers] == DLQ_HEADERS
    assert names[h.DLQ_ERROR_CODE] == code.value.encode()
    assert names[h.CONNECT_STAGE] == b"KAFKA_PRODUCE"
    assert names[h.CONNECT_EXCEPTION] == h.connect_exception_class(code).encode()
    assert names[h.CONNECT_EXCEPTION_MESSAGE] == b"team.replies: refused"
    assert names[h.CONNECT_TASK_ID] == b"w1"
    assert (names[h.CONNECT_TOPIC], names[h.CONNECT_OFFSET]) == (b"tokenmill.requests", b"1041")


def test_a_dead_letter_already_made_at_the_door_is_kept_when_undeliverable() -> None:
    door = reject(ErrorCode.MISSING_ID)
    outcome = undeliverable(
        door, ErrorCode.REPLY_TO_REFUSED, "refused", results_topic="r", value=None
    )
    assert outcome.dead_letter is door.dead_letter


def test_the_messages_are_cut_on_a_character_boundary() -> None:
    letter = reject(ErrorCode.SCHEMA_VIOLATION, "é" * 1000, worker="ü" * 600).dead_letter
    assert letter is not None
    for name in (h.DLQ_ERROR_MESSAGE, h.CONNECT_EXCEPTION_MESSAGE):
        value = h.header(letter.headers, name)
        assert value is not None and value.decode() == "é" * 512  # 1,024 bytes
    task = h.header(letter.headers, h.CONNECT_TASK_ID)
    assert task is not None and task.decode() == "ü" * 256  # 512 bytes


def header_bytes(headers: list[tuple[str, bytes]]) -> int:
    return sum(len(k.encode()) + len(v) + 6 for k, v in headers)


@pytest.mark.parametrize("slack", [0, 2048, 8192])
def test_all_headers_of_a_dead_letter_stay_within_the_budget(slack: int) -> None:
    # Original headers just below the budget on their own: with ours they may be over it.
    big = [("x-blob", b"b" * (DEAD_LETTER_HEADER_BYTES - slack - 20))]
    letter = reject(ErrorCode.INVALID_JSON, "m" * 5000, headers=big, worker="w" * 600).dead_letter
    assert letter is not None
    headers = list(letter.headers)
    assert header_bytes(headers) <= DEAD_LETTER_HEADER_BYTES
    names = dict(headers)
    kept = "x-blob" in names
    assert kept == (slack == 8192), "kept only when ours fit beside them"
    if not kept:
        assert names[h.DLQ_HEADERS_DROPPED] == b"1"
    assert set(DLQ_HEADERS) <= set(names), "ours are never dropped"


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
    assert outcome.trace.headers == [("traceparent", TRACEPARENT), ("tracestate", b"vendor=1")]
    assert reject(ErrorCode.INVALID_JSON, headers=[]).trace == TraceContext()


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
        trace=TraceContext.of([("traceparent", TRACEPARENT)]),
        consumed_at=time.monotonic() - 0.25,
        deadline=None,
    )


def completion(
    item: Admitted, reason: str, token_ids: list[int], text: str = "abc", **kw: Any
) -> Completion:
    """What the engine hands over for `item`: 20 ms to the first token, 5 ms a token after."""
    arrival = item.consumed_at
    first = arrival + 0.020
    fields: dict[str, Any] = {
        "request_id": item.request.id,
        "prompt_tokens": len(item.prompt_token_ids),
        "token_ids": token_ids,
        "text": text,
        "finish_reason": reason,
        "arrival_time": arrival,
        "first_token_time": first if token_ids else None,
        "finish_time": first + 0.005 * max(0, len(token_ids) - 1),
        "num_preemptions": 0,
    }
    return Completion(**{**fields, **kw})


def finished(item: Admitted, reason: str, token_ids: list[int], **kw: Any) -> Outcome:
    error = kw.pop("error", None)
    ran = completion(item, reason, token_ids, **kw)
    return engine_outcome(item, ran, model=MODEL, worker="w1", queued_ms=1.5, error=error)


def test_engine_outcome_usage_and_timings() -> None:
    item = admitted(prompt_tokens=5, metadata={"row": "1"})
    outcome = finished(item, "length", [10, 11, 12])
    result = outcome.result
    assert result.ok and result.finish_reason is FinishReason.LENGTH
    assert (result.usage.prompt_tokens, result.usage.completion_tokens) == (5, 3)
    assert result.usage.total_tokens == 8
    assert (result.id, result.text, result.token_ids) == ("req-9", "abc", [10, 11, 12])
    assert (result.model, result.worker, result.metadata) == (MODEL, "w1", {"row": "1"})
    assert result.timings.queued_ms == 1.5
    assert (result.timings.ttft_ms, result.timings.tpot_ms) == pytest.approx((20.0, 5.0))
    assert 250 <= result.timings.total_ms < 60_000  # consumed 0.25 s ago
    assert result.source == RECORD.source()
    assert outcome.admitted and outcome.cost_tokens == 5 + 8
    assert outcome.trace == item.trace
    assert (outcome.reply_topic, outcome.content_type) == ("team.replies", MSGPACK)
    assert outcome.dead_letter is None


def test_engine_outcome_maps_the_whole_completion() -> None:
    item = admitted(prompt_tokens=5)
    logprobs = CompletionLogprobs(
        tokens=["a"],
        token_logprobs=[-0.5],
        top_ids=[[7]],
        top_logprobs=[[-0.5]],
        top_tokens=[["a"]],
    )
    prompt = CompletionLogprobs(
        tokens=["x", "y"], token_logprobs=[0.0, -2.0], top_ids=[[], [4]], top_logprobs=[[], [-1.0]],
        top_tokens=[[], ["z"]], unscored_first=True, token_ids=[5, 6],
    )  # fmt: skip
    ran = completion(
        item, "stop", [7], prompt_tokens=4, num_preemptions=2, num_kv_blocks=3, cached_tokens=2,
        logprobs=logprobs, prompt_logprobs=prompt, prompt_text="xy",
        draft_tokens=6, accepted_draft_tokens=4,
    )  # fmt: skip
    outcome = engine_outcome(item, ran, model=MODEL, worker="w1", queued_ms=0.0)
    result = outcome.result
    assert (outcome.preemptions, outcome.kv_blocks) == (2, 3)
    assert result.usage == Usage(
        prompt_tokens=4,  # as the engine counted them, not the ingest
        completion_tokens=1,
        total_tokens=5,
        cached_tokens=2,
        accepted_draft_tokens=4,
        rejected_draft_tokens=2,
    )
    assert result.logprobs == TokenLogprobs(
        tokens=["a"],
        token_logprobs=[-0.5],
        top_ids=[[7]],
        top_logprobs=[[-0.5]],
        top_tokens=[["a"]],
    )
    assert result.prompt_logprobs is not None and result.prompt_logprobs.unscored_first
    assert result.prompt_logprobs.token_ids == [5, 6] and result.prompt_text == "xy"
    assert result.timings.tpot_ms is None  # one token: no time per token after the first


def test_a_completion_without_speculation_reports_no_draft_tokens() -> None:
    usage = finished(admitted(), "length", [1, 2]).result.usage
    assert (usage.accepted_draft_tokens, usage.rejected_draft_tokens) == (0, 0)


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
    outcome = unrun_outcome(
        admitted(prompt_tokens=3), "error", model=MODEL, worker="w1", error=error
    )
    result = outcome.result
    assert result.finish_reason is FinishReason.ERROR and result.error == error
    assert (result.text, result.token_ids) == ("", [])
    assert (result.usage.prompt_tokens, result.usage.completion_tokens) == (3, 0)
    assert result.usage.total_tokens == 3
    assert (result.timings.ttft_ms, result.timings.tpot_ms) == (None, None)
    assert result.timings.queued_ms == result.timings.total_ms >= 250  # queued until now
    assert outcome.admitted and (outcome.preemptions, outcome.kv_blocks) == (0, 0)


def test_a_request_cancelled_before_the_engine() -> None:
    outcome = cancelled_before_engine(admitted(), model=MODEL, worker="w1", where="bucket")
    assert outcome.result.finish_reason is FinishReason.CANCELLED
    assert outcome.result.error is None and outcome.cancelled_in == "bucket"


def test_a_result_with_choices_counts_every_choices_tokens() -> None:
    item = admitted(prompt_tokens=5, n=2)
    first = completion(item, "length", [10, 11], text="ab")
    second = completion(item, "stop", [12], text="c")
    result = finished(item, "length", [10, 11], text="ab", choices=(first, second)).result
    assert result.choices == [
        Choice(index=0, text="ab", token_ids=[10, 11], finish_reason=FinishReason.LENGTH),
        Choice(index=1, text="c", token_ids=[12], finish_reason=FinishReason.STOP),
    ]
    assert result.token_ids == [10, 11]
    assert (result.usage.completion_tokens, result.usage.total_tokens) == (3, 8)
    assert item.cost_tokens == 5 + 2 * 8  # the prompt once, every choice's new tokens
