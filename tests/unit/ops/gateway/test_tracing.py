"""The gateway's span continues the caller's trace, and the record carries the span."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from ops.gateway.errors import timed_out
from ops.gateway.tracing import request_span

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT = f"00-{TRACE_ID}-b7ad6b7169203331-01"


def tracer() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def test_the_span_is_a_child_of_the_caller_s_and_the_record_carries_it() -> None:
    provider, exporter = tracer()
    with request_span("/v1/completions", "gw-1", PARENT, None, provider.get_tracer("t")) as headers:
        pass
    [span] = exporter.get_finished_spans()
    assert span.name == "POST /v1/completions" and span.kind == SpanKind.SERVER
    assert format(span.context.trace_id, "032x") == TRACE_ID
    assert span.parent is not None and format(span.parent.span_id, "016x") == "b7ad6b7169203331"
    assert span.attributes is not None and span.attributes["tokenmill.request_id"] == "gw-1"
    [(name, value)] = headers
    assert name == "traceparent"
    assert value.decode() == f"00-{TRACE_ID}-{span.context.span_id:016x}-01"


def test_without_a_caller_s_context_the_span_starts_a_trace() -> None:
    provider, exporter = tracer()
    with request_span("/v1/chat/completions", "gw-2", None, None, provider.get_tracer("t")):
        pass
    [span] = exporter.get_finished_spans()
    assert span.parent is None


def test_a_server_error_marks_the_span() -> None:
    provider, exporter = tracer()
    with (
        pytest.raises(type(timed_out(1))),
        request_span("/v1/completions", "gw-3", None, None, provider.get_tracer("t")),
    ):
        raise timed_out(1)
    [span] = exporter.get_finished_spans()
    assert span.status.status_code == StatusCode.ERROR
    assert span.attributes is not None and span.attributes["http.response.status_code"] == 504


def test_without_tracing_the_caller_s_context_goes_on_unchanged() -> None:
    with request_span("/v1/completions", "gw-4", PARENT, None) as headers:
        assert headers == [("traceparent", PARENT.encode())]
