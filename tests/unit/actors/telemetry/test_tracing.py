"""A request's spans, recorded from an `Outcome` when its result is sent
(actors/telemetry/tracing.py), read back as the export process builds them: names, parents,
kinds, times, attributes, links and the result's headers."""

from __future__ import annotations

import dataclasses

import msgspec
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased, TraceIdRatioBased
from opentelemetry.trace import SpanKind, StatusCode

from actors.mail import Outcome, RecordRef
from actors.telemetry.trace_context import TraceContext
from actors.telemetry.tracing import start_request_spans
from messages.error_codes import ErrorCode
from messages.request import ChatMessage, GenerateRequest
from messages.response_format import ResponseFormat
from messages.result import ErrorInfo, FinishReason, GenerateResult, ModelRef, Timings, Usage
from messages.structured_output import StructuredOutput
from tests.unit.span_capture import SpanCapture

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT = f"00-{TRACE_ID}-b7ad6b7169203331-01".encode()
NOW = 1_800_000_000_000_000_000  # ns


def outcome(*, admitted: bool = True, error: ErrorInfo | None = None) -> Outcome:
    result = GenerateResult(
        id="job-1",
        finish_reason=FinishReason.ERROR if error else FinishReason.LENGTH,
        usage=Usage(prompt_tokens=3, completion_tokens=2, total_tokens=5),
        model=ModelRef(name="smollm2-135m", digest="sha256:ab"),
        timings=Timings(queued_ms=1.0, ttft_ms=4.0, total_ms=10.0),
        error=error,
    )
    return Outcome(
        record=RecordRef(topic="reqs", partition=2, offset=17, timestamp_ms=0, key=b"job-1"),
        result=result,
        reply_topic="res",
        content_type="application/json",
        trace=TraceContext.of([("traceparent", PARENT)]),
        admitted=admitted,
        request=GenerateRequest(id="job-1", messages=[ChatMessage(role="user", content="Hi")],
                                max_new_tokens=7, temperature=0.5, model="smollm2-135m"),
        finished_ns=NOW - 2_000_000,  # the emitter got to it 2 ms after it finished
    )  # fmt: skip


def recorded(item: Outcome) -> tuple[dict[str, object], list[tuple[str, bytes]]]:
    capture = SpanCapture()
    spans = start_request_spans(item, group="workers", now_ns=NOW, recorder=capture.recorder)
    spans.end()
    return capture.by_name(), spans.headers


def test_without_a_recorder_nothing_is_recorded_and_the_headers_pass_through() -> None:
    spans = start_request_spans(outcome(), group="workers")
    assert spans.headers == [("traceparent", PARENT)]
    spans.end()


def test_the_spans_continue_the_producers_trace_with_their_phases_in_time() -> None:
    spans, headers = recorded(outcome())
    assert set(spans) == {"process reqs", "queue", "prefill", "decode", "send res"}
    process = spans["process reqs"]
    assert f"{process.context.trace_id:032x}" == TRACE_ID
    assert f"{process.parent.span_id:016x}" == "b7ad6b7169203331"
    assert process.kind == SpanKind.CONSUMER and spans["send res"].kind == SpanKind.PRODUCER
    for child in ("queue", "prefill", "decode", "send res"):
        assert spans[child].parent.span_id == process.context.span_id
    consumed = NOW - 12_000_000  # 10 ms of timings, ending when the outcome was made
    assert process.start_time == consumed
    assert spans["decode"].end_time == NOW - 2_000_000
    assert (spans["queue"].start_time, spans["queue"].end_time) == (consumed, consumed + 1_000_000)
    assert spans["prefill"].end_time == spans["decode"].start_time == consumed + 4_000_000
    attributes = process.attributes
    assert attributes["messaging.kafka.offset"] == 17
    assert attributes["messaging.destination.partition.id"] == "2"
    assert attributes["messaging.consumer.group.name"] == "workers"
    assert attributes["tokenmill.request_id"] == "job-1"
    assert attributes["gen_ai.usage.output_tokens"] == 2
    assert attributes["gen_ai.response.model"] == "smollm2-135m"
    assert attributes["gen_ai.request.model"] == "smollm2-135m"
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["tokenmill.preemptions"] == 0
    assert attributes["gen_ai.request.max_tokens"] == 7
    assert attributes["gen_ai.request.temperature"] == 0.5
    ((name, value),) = headers
    send = spans["send res"].context
    assert (name, value.decode()) == ("traceparent", f"00-{TRACE_ID}-{send.span_id:016x}-01")


def test_a_refused_request_has_an_error_and_no_engine_phases() -> None:
    refused = ErrorInfo(code=ErrorCode.PROMPT_TOO_LONG, message="too long")
    spans, _ = recorded(outcome(admitted=False, error=refused))
    assert set(spans) == {"process reqs", "send res"}
    process = spans["process reqs"]
    assert process.status.status_code == StatusCode.ERROR
    assert process.attributes["error.type"] == "prompt_too_long"
    assert "tokenmill.preemptions" not in process.attributes, "it never reached the engine"


def test_a_batch_span_links_its_members_and_their_process_spans_link_back() -> None:
    from actors.mail import Admitted, Batch
    from actors.telemetry.tracing import record_batch_span

    capture = SpanCapture()
    item = outcome()
    member = Admitted(
        request=GenerateRequest(id="job-1", prompt_token_ids=[1, 2, 3]),
        record=item.record,
        prompt_token_ids=[1, 2, 3],
        reply_topic="res",
        content_type="application/json",
        trace=TraceContext.of([("traceparent", PARENT)]),
        consumed_at=0.0,
        deadline=None,
    )
    batch = Batch(bucket=32, items=[member], tokens=19, reason="size")
    batch_context = record_batch_span(batch, capture.recorder)
    assert batch_context is not None
    (batch_span,) = capture.spans()
    assert batch_span.name == "batch" and batch_span.parent is None
    assert batch_span.attributes["tokenmill.batch.size"] == 1
    assert batch_span.attributes["tokenmill.bucket"] == 32
    (link,) = batch_span.links
    assert f"{link.context.trace_id:032x}" == TRACE_ID

    item.batch_span = batch_context
    spans = start_request_spans(item, group="workers", now_ns=NOW, recorder=capture.recorder)
    spans.end()
    process = capture.by_name()["process reqs"]
    (back,) = process.links
    assert back.context.span_id == batch_context.span_id


def test_without_a_recorder_a_batch_has_no_span() -> None:
    from actors.mail import Batch
    from actors.telemetry.tracing import record_batch_span

    assert record_batch_span(Batch(bucket=32, items=[], tokens=0, reason="size")) is None


def test_the_process_span_counts_the_kv_blocks_the_request_held() -> None:
    item = outcome()
    item.kv_blocks = 3
    spans, _ = recorded(item)
    assert spans["process reqs"].attributes["tokenmill.kv_blocks"] == 3


def test_the_process_span_says_how_many_prompt_tokens_the_prefix_cache_served() -> None:
    item = outcome()
    item.result.usage.cached_tokens = 2
    spans, _ = recorded(item)
    assert spans["process reqs"].attributes["tokenmill.cached_tokens"] == 2


def test_a_send_that_fails_ends_process_and_send_with_its_error() -> None:
    capture = SpanCapture()
    spans = start_request_spans(outcome(), group="workers", now_ns=NOW, recorder=capture.recorder)
    spans.end(TimeoutError("broker"))
    for span in capture.spans():
        if span.name in ("process reqs", "send res"):
            assert span.status.status_code == StatusCode.ERROR
            assert span.attributes["error.type"] == "TimeoutError"


def test_an_unsampled_parent_records_nothing_and_passes_its_decision_on() -> None:
    item = outcome()
    item.trace = TraceContext.of([("traceparent", f"00-{TRACE_ID}-b7ad6b7169203331-00".encode())])
    capture = SpanCapture()
    spans = start_request_spans(item, group="workers", now_ns=NOW, recorder=capture.recorder)
    spans.end()
    assert capture.records == []
    ((_name, value),) = spans.headers
    _version, trace_id, span_id, flags = value.decode().split("-")
    assert (trace_id, flags) == (TRACE_ID, "00") and span_id != "b7ad6b7169203331"


def test_the_samplers_ratio_decides_for_a_request_without_a_parent() -> None:
    item = outcome()
    item.trace = TraceContext()
    kept = SpanCapture(ParentBased(TraceIdRatioBased(1.0)))
    start_request_spans(item, group="w", now_ns=NOW, recorder=kept.recorder).end()
    assert {s.parent for s in kept.spans() if s.name == "process reqs"} == {None}
    dropped = SpanCapture(ParentBased(ALWAYS_OFF))
    spans = start_request_spans(item, group="w", now_ns=NOW, recorder=dropped.recorder)
    spans.end()
    assert dropped.records == [] and spans.headers[0][1].endswith(b"-00")


def test_tracestate_travels_on_to_the_result_and_the_spans() -> None:
    item = outcome()
    item.trace = TraceContext.of([("traceparent", PARENT), ("tracestate", b"vendor=abc")])
    spans, headers = recorded(item)
    assert ("tracestate", b"vendor=abc") in headers
    assert spans["send res"].context.trace_state.to_header() == "vendor=abc"


def test_a_constrained_request_names_its_response_format() -> None:
    plain, _ = recorded(outcome())
    assert "tokenmill.response_format" not in plain["process reqs"].attributes
    base = outcome()
    assert base.request is not None
    json_object = ResponseFormat(type="json_object")
    request = msgspec.structs.replace(base.request, response_format=json_object)
    spans, _ = recorded(dataclasses.replace(base, request=request))
    assert spans["process reqs"].attributes["tokenmill.response_format"] == "json_object"
    assert "tokenmill.structured_output" not in spans["process reqs"].attributes
    choice = StructuredOutput(choice=["a", "b"])
    request = msgspec.structs.replace(base.request, structured_output=choice)
    spans, _ = recorded(dataclasses.replace(base, request=request))
    assert spans["process reqs"].attributes["tokenmill.structured_output"] == "choice"


def test_the_decode_span_counts_speculations_guesses_when_there_were_some() -> None:
    spans, _ = recorded(outcome())
    assert not any(k.startswith("tokenmill.speculative.") for k in spans["decode"].attributes)
    item = outcome()
    item.result.usage.accepted_draft_tokens = 5
    item.result.usage.rejected_draft_tokens = 3
    spans, _ = recorded(item)
    attributes = spans["decode"].attributes
    assert attributes["tokenmill.speculative.draft_tokens"] == 8
    assert attributes["tokenmill.speculative.accepted_tokens"] == 5
