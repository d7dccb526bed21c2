"""Bounded spans (actors/telemetry/span_bounds.py): what a hostile request puts in its spans is
cut and clamped before it is recorded, so the OTLP exporter can encode every span; and the span
sink's queue is bounded in estimated bytes as well as in records."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from actors.mail import Admitted, Batch, Outcome, RecordRef
from actors.telemetry.lifecycle_spans import record_event_span
from actors.telemetry.span_bounds import (
    ELLIPSIS,
    INT64_MAX,
    INT64_MIN,
    MAX_LIST_ITEMS,
    MAX_TEXT_CHARS,
    RECORD_OVERHEAD_BYTES,
    bound_text,
    bound_value,
    estimated_bytes,
    text_of_bytes,
)
from actors.telemetry.span_records import SpanRecord
from actors.telemetry.span_sink import SpanSink
from actors.telemetry.trace_context import TraceContext
from actors.telemetry.tracing import record_batch_span, start_request_spans
from messages.error_codes import ErrorCode
from messages.events import ModelSwapFailed
from messages.request import GenerateRequest
from messages.result import ErrorInfo, FinishReason, GenerateResult, ModelRef, Timings, Usage
from tests.unit.span_capture import SpanCapture

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT = f"00-{TRACE_ID}-b7ad6b7169203331-01".encode()
NOW = 1_800_000_000_000_000_000  # ns
LONG = "x" * 100_000
HUGE = 2**64 - 1  # a uint64 a request may carry; beyond an OTLP int attribute's int64


def hostile_outcome() -> Outcome:
    result = GenerateResult(
        id="id-" + LONG,
        finish_reason=FinishReason.ERROR,
        usage=Usage(prompt_tokens=3, completion_tokens=HUGE, total_tokens=HUGE),
        model=ModelRef(name="smollm2-135m", digest="sha256:ab"),
        timings=Timings(queued_ms=1.0, ttft_ms=4.0, total_ms=10.0),
        error=ErrorInfo(code=ErrorCode.INVALID_PROMPT, message="bad: " + LONG),
    )
    return Outcome(
        record=RecordRef(topic="reqs", partition=2, offset=17, timestamp_ms=0,
                         key=b"\xff\xfe" + b"k" * 1_000_000),
        result=result,
        reply_topic="res." + LONG,
        content_type="application/json",
        trace=TraceContext.of([("traceparent", PARENT)]),
        admitted=True,
        request=GenerateRequest(id="id-" + LONG, prompt="Hi", max_new_tokens=HUGE,
                                temperature=math.inf, model="model-" + LONG),
        finished_ns=NOW - 2_000_000,
        kv_blocks=-HUGE,  # below int64: msgpack (the sink's wire format) cannot encode it
    )  # fmt: skip


def assert_bounded(span: ReadableSpan) -> None:
    assert len(span.name) <= MAX_TEXT_CHARS
    if span.status.description is not None:
        assert len(span.status.description) <= MAX_TEXT_CHARS
    attributes = [span.attributes or {}] + [link.attributes or {} for link in span.links]
    for value in (v for each in attributes for v in each.values()):
        if isinstance(value, str):
            assert len(value) <= MAX_TEXT_CHARS
        elif isinstance(value, int):
            assert INT64_MIN <= value <= INT64_MAX
        elif isinstance(value, tuple):
            assert len(value) <= MAX_LIST_ITEMS and all(len(v) <= MAX_TEXT_CHARS for v in value)


def encoded_attribute_keys(spans: list[ReadableSpan]) -> list[set[str]]:
    """Each span's attribute keys as the OTLP exporter encodes them (it drops, with an error
    logged, a value it cannot encode)."""
    request = encode_spans(spans)
    encoded = request.resource_spans[0].scope_spans[0].spans
    return [{kv.key for kv in span.attributes} for span in encoded]


def exported(spans: list[ReadableSpan]) -> InMemorySpanExporter:
    """Through the OTLP exporter's own encoding, every attribute kept, then to the SDK's
    in-memory exporter."""
    assert encoded_attribute_keys(spans) == [set(span.attributes or {}) for span in spans]
    exporter = InMemorySpanExporter()
    assert exporter.export(spans) is SpanExportResult.SUCCESS
    return exporter


def test_the_exporters_encoding_drops_an_integer_beyond_int64() -> None:
    """Why integers are clamped: unbounded, such an attribute is lost from every span."""
    capture = SpanCapture()
    capture.records.append(SpanRecord("x", 0, TRACE_ID, 1, 0, False, 1, 2, {"n": HUGE, "m": 1}))
    assert encoded_attribute_keys(capture.spans()) == [{"m"}]


def test_a_hostile_requests_spans_are_bounded_and_exportable() -> None:
    capture = SpanCapture()
    item = hostile_outcome()
    spans = start_request_spans(item, group="workers", now_ns=NOW, recorder=capture.recorder)
    spans.end(RuntimeError("send failed: " + LONG))

    got = exported(capture.spans()).get_finished_spans()

    assert len(got) == 5
    for span in got:
        assert_bounded(span)
    by_name = {span.name: span for span in got}
    process = by_name["process reqs"]
    attributes = process.attributes or {}
    model = attributes["gen_ai.request.model"]
    assert isinstance(model, str) and model == "model-" + "x" * (MAX_TEXT_CHARS - 7) + ELLIPSIS
    key = attributes["messaging.kafka.message.key"]
    assert isinstance(key, str) and key.startswith("\ufffd") and key.endswith(ELLIPSIS)
    assert attributes["gen_ai.request.max_tokens"] == INT64_MAX
    assert attributes["gen_ai.usage.output_tokens"] == INT64_MAX
    assert attributes["tokenmill.kv_blocks"] == INT64_MIN
    assert attributes["gen_ai.request.temperature"] == math.inf  # OTLP encodes it as it is
    assert attributes["messaging.kafka.offset"] == 17  # what was short stays as it was
    assert process.status.status_code is StatusCode.ERROR
    (send,) = (span for span in got if span.name.startswith("send res."))
    assert send.name.endswith(ELLIPSIS)


def test_a_batch_spans_links_carry_bounded_request_ids() -> None:
    capture = SpanCapture()
    item = hostile_outcome()
    member = Admitted(
        request=GenerateRequest(id="id-" + LONG, prompt_token_ids=[1, 2, 3]),
        record=item.record,
        prompt_token_ids=[1, 2, 3],
        reply_topic="res",
        content_type="application/json",
        trace=TraceContext.of([("traceparent", PARENT)]),
        consumed_at=0.0,
        deadline=None,
    )
    assert record_batch_span(Batch(bucket=32, items=[member], tokens=3, reason="size"),
                             capture.recorder) is not None  # fmt: skip

    (batch,) = exported(capture.spans()).get_finished_spans()

    assert_bounded(batch)
    (link,) = batch.links
    assert link.attributes is not None
    assert link.attributes["tokenmill.request_id"] == bound_text("id-" + LONG)


def test_a_lifecycle_events_span_is_bounded() -> None:
    capture = SpanCapture()
    event = ModelSwapFailed(worker="w1", at=1.0, to_model="m" + LONG, reason="r" + LONG)
    record_event_span(event, capture.recorder)

    (span,) = exported(capture.spans()).get_finished_spans()

    assert_bounded(span)
    assert span.status.description == bound_text("r" + LONG)


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        ("a" * MAX_TEXT_CHARS, "a" * MAX_TEXT_CHARS),
        ("a" * (MAX_TEXT_CHARS + 1), "a" * (MAX_TEXT_CHARS - 1) + ELLIPSIS),
        ("", ""),
    ],
)
def test_text_is_cut_at_the_limit_with_an_ellipsis(text: str, kept: str) -> None:
    assert bound_text(text) == kept


def test_bytes_are_decoded_then_cut_even_when_every_character_is_four_bytes() -> None:
    emoji = "\U0001f600"
    assert text_of_bytes((emoji * MAX_TEXT_CHARS).encode()) == emoji * MAX_TEXT_CHARS
    cut = text_of_bytes((emoji * (MAX_TEXT_CHARS + 1)).encode())
    assert cut == emoji * (MAX_TEXT_CHARS - 1) + ELLIPSIS
    assert text_of_bytes(b"ok\xff") == "ok\ufffd"


def test_values_keep_their_type_within_bounds() -> None:
    assert bound_value(2**70) == INT64_MAX and bound_value(-(2**70)) == INT64_MIN
    assert bound_value(True) is True and bound_value(5) == 5
    assert math.isnan(bound_value(math.nan))  # type: ignore[arg-type]
    items = bound_value(["y" * 1000] * 100)
    assert isinstance(items, list) and len(items) == MAX_LIST_ITEMS
    assert {len(item) for item in items} == {MAX_TEXT_CHARS}


def test_a_records_estimated_bytes_grow_with_its_strings() -> None:
    empty = SpanRecord("", 0, TRACE_ID, 1, 0, False, 1, 2, {})
    assert estimated_bytes(empty) == RECORD_OVERHEAD_BYTES
    filled = SpanRecord("name", 0, TRACE_ID, 1, 0, False, 1, 2, {"k": "v" * 100, "n": 1},
                        error="e" * 10, trace_state="a=b")  # fmt: skip
    assert estimated_bytes(filled) == RECORD_OVERHEAD_BYTES + 4 + (1 + 100) + (1 + 8) + 10 + 3


def test_a_typical_requests_spans_fit_the_default_byte_budget_well() -> None:
    """The byte budget holds back long spans, not the record count's worth of usual ones."""
    from tests.unit.actors.telemetry.test_tracing import outcome

    capture = SpanCapture()
    start_request_spans(outcome(), group="workers", now_ns=NOW, recorder=capture.recorder).end()
    per_record = sum(map(estimated_bytes, capture.records)) / len(capture.records)
    sink = SpanSink(["unused"])
    assert sink.max_queued * per_record < sink.max_queued_bytes


# -- the sink's byte budget, against a real export-process stand-in (see test_span_sink) ------

READER = """
import sys, msgspec
out = open(sys.argv[1], "a")
while len(header := sys.stdin.buffer.read(4)) == 4:
    for record in msgspec.msgpack.decode(sys.stdin.buffer.read(int.from_bytes(header, "big"))):
        out.write(record[0] + "\\n")
    out.flush()
"""


def sized(name: str, chars: int) -> SpanRecord:
    return SpanRecord(name, 0, TRACE_ID, 1, 0, False, 1, 2, {"k": "v" * chars})


def test_a_sink_over_its_byte_budget_drops_and_counts(tmp_path: Path) -> None:
    out = tmp_path / "names"
    small = estimated_bytes(sized("a", 100))
    # Room for three small records; the writer waits (a minute) so nothing leaves meanwhile.
    sink = SpanSink([sys.executable, "-c", READER, str(out)], max_queued_bytes=3 * small,
                    flush_every=60)  # fmt: skip
    sink.start()
    sink.record([sized("a", 100), sized("b", 100)])
    assert sink.queued_bytes == 2 * small
    sink.record([sized("big", 10_000)])  # one record, but over what is left: dropped
    sink.record([sized("c", 100), sized("d", 100)])  # together over: both dropped
    sink.record([sized("e", 100)])  # exactly fills it
    assert (sink.refused, sink.queued_bytes) == (3, 3 * small)
    sink.close(timeout=60)
    assert out.read_text().split() == ["a", "b", "e"]
    assert (sink.written, sink.dropped, sink.queued_bytes) == (3, 3, 0)


def test_spans_written_out_give_their_bytes_back(tmp_path: Path) -> None:
    out = tmp_path / "names"
    small = estimated_bytes(sized("a", 100))
    sink = SpanSink([sys.executable, "-c", READER, str(out)], max_queued_bytes=2 * small,
                    batch=2, flush_every=0.02)  # fmt: skip
    sink.start()
    for name in ("a", "b", "c", "d", "e", "f"):
        _wait_for(lambda: sink.queued_bytes == 0)  # the previous ones are written out
        sink.record([sized(name, 100)])
    sink.close(timeout=60)
    assert out.read_text().split() == ["a", "b", "c", "d", "e", "f"]
    assert sink.dropped == 0


def _wait_for(condition: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)
