"""The per-request log line: sampled successes, every engine failure, trace context bound,
payloads only when asked for (structlog's capture_logs, no services)."""

from __future__ import annotations

from structlog.contextvars import merge_contextvars
from structlog.testing import capture_logs

from actors.mail import Outcome, RecordRef
from actors.telemetry.request_log import log_outcome, trace_ids
from messages.error_codes import ErrorCode
from messages.request import GenerateRequest
from messages.result import ErrorInfo, FinishReason, GenerateResult

TRACE = "0af7651916cd43dd8448eb211c80319c"
SPAN = "b7ad6b7169203331"
HEADERS = [("traceparent", f"00-{TRACE}-{SPAN}-01".encode())]


def outcome(*, error: ErrorCode | None = None, admitted: bool = True) -> Outcome:
    return Outcome(
        record=RecordRef(topic="reqs", partition=1, offset=9, timestamp_ms=0),
        result=GenerateResult(
            id="job-1",
            text="secret answer",
            finish_reason=FinishReason.ERROR if error else FinishReason.STOP,
            error=ErrorInfo(code=error, message="it failed") if error else None,
        ),
        reply_topic="res",
        content_type="application/json",
        admitted=admitted,
        request=GenerateRequest(id="job-1", prompt="secret prompt"),
    )


def test_a_sampled_success_carries_the_request_and_trace_context_but_no_text() -> None:
    with capture_logs(processors=[merge_contextvars]) as logs:
        log_outcome(outcome(), HEADERS, sample_rate=0.5, payloads=False, draw=lambda: 0.1)
    (line,) = logs
    assert line["event"] == "request_done" and line["log_level"] == "info"
    assert (line["request_id"], line["trace_id"], line["span_id"]) == ("job-1", TRACE, SPAN)
    assert (line["topic"], line["partition"], line["offset"]) == ("reqs", 1, 9)
    assert "prompt" not in line and "text" not in line


def test_successes_outside_the_sample_are_not_logged() -> None:
    with capture_logs() as logs:
        log_outcome(outcome(), HEADERS, sample_rate=0.5, payloads=False, draw=lambda: 0.7)
        log_outcome(outcome(), HEADERS, sample_rate=0.0, payloads=False, draw=lambda: 0.0)
    assert logs == []


def test_an_engine_failure_is_always_logged() -> None:
    with capture_logs() as logs:
        failed = outcome(error=ErrorCode.ENGINE_ERROR)
        log_outcome(failed, HEADERS, sample_rate=0.0, payloads=False, draw=lambda: 0.99)
    (line,) = logs
    assert (line["event"], line["log_level"], line["code"]) == (
        "request_failed", "warning", "engine_error",
    )  # fmt: skip


def test_a_refusal_at_the_door_is_left_to_the_ingest() -> None:
    with capture_logs() as logs:
        refused = outcome(error=ErrorCode.PROMPT_TOO_LONG, admitted=False)
        log_outcome(refused, HEADERS, sample_rate=1.0, payloads=False)
    assert logs == []


def test_payloads_only_when_asked_for() -> None:
    with capture_logs() as logs:
        log_outcome(outcome(), HEADERS, sample_rate=1.0, payloads=True)
    (line,) = logs
    assert (line["prompt"], line["text"]) == ("secret prompt", "secret answer")


def test_trace_ids_of_a_missing_or_malformed_traceparent_are_empty() -> None:
    assert trace_ids([]) == ("", "")
    assert trace_ids([("traceparent", b"garbage")]) == ("", "")
    assert trace_ids(HEADERS) == (TRACE, SPAN)
