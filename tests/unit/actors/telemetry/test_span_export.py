"""The span export process's loop (actors/telemetry/span_export.py): frames of span records in,
the SDK's spans out to an exporter, with the process's resource; a frame cut short ends the
input."""

from __future__ import annotations

import io

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from actors.telemetry.span_export import export_frames
from actors.telemetry.span_link import SpanLink
from actors.telemetry.span_records import SpanRecord, encode_records
from actors.telemetry.span_sink import FRAME_HEADER_BYTES

TRACE = "0af7651916cd43dd8448eb211c80319c"


def frame(records: list[SpanRecord]) -> bytes:
    payload = encode_records(records)
    return len(payload).to_bytes(FRAME_HEADER_BYTES, "big") + payload


def test_frames_become_spans_with_their_ids_times_links_and_status() -> None:
    process = SpanRecord(
        "process reqs", SpanKind.CONSUMER.value, TRACE, 7, 5, True, 100, 900,
        {"messaging.kafka.offset": 17, "gen_ai.response.finish_reasons": ["length"]},
        links=[SpanLink("ab" * 16, 9, {"tokenmill.request_id": "r"})],
        error="too long", trace_state="v=1",
    )  # fmt: skip
    send = SpanRecord("send res", SpanKind.PRODUCER.value, TRACE, 8, 7, False, 800, 900, {})
    exporter = InMemorySpanExporter()
    resource = Resource.create({"service.name": "tokenmill", "service.instance.id": "w1"})
    source = io.BytesIO(frame([process]) + frame([send]))

    assert export_frames(source, exporter, resource) == 2

    got = {span.name: span for span in exporter.get_finished_spans()}
    p, s = got["process reqs"], got["send res"]
    assert (p.context.trace_id, p.context.span_id) == (int(TRACE, 16), 7)
    assert p.parent is not None and p.parent.span_id == 5 and p.parent.is_remote
    assert s.parent is not None and s.parent.span_id == 7 and not s.parent.is_remote
    assert (p.kind, s.kind) == (SpanKind.CONSUMER, SpanKind.PRODUCER)
    assert (p.start_time, p.end_time) == (100, 900)
    assert p.attributes["messaging.kafka.offset"] == 17
    assert tuple(p.attributes["gen_ai.response.finish_reasons"]) == ("length",)
    assert p.status.status_code is StatusCode.ERROR and p.status.description == "too long"
    assert s.status.status_code is StatusCode.UNSET
    (link,) = p.links
    assert link.context.span_id == 9 and link.attributes["tokenmill.request_id"] == "r"
    assert p.context.trace_state.to_header() == "v=1"
    assert p.resource.attributes["service.instance.id"] == "w1"


def test_a_frame_cut_short_ends_the_input_without_an_error() -> None:
    whole = frame([SpanRecord("a", 0, TRACE, 1, 0, False, 1, 2, {})])
    exporter = InMemorySpanExporter()
    source = io.BytesIO(whole + whole[:-3])
    assert export_frames(source, exporter, Resource.create({})) == 1
    assert [s.name for s in exporter.get_finished_spans()] == ["a"]
