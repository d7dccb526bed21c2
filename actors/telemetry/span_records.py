"""Finished spans as plain records: what the worker's hot path makes instead of SDK spans.

A `SpanRecord` is the data of one finished span (ids, times, attributes, links, status) and
nothing else: no locks, no processors, no attribute validation. The worker builds a request's
records in a few microseconds and hands them to the span export process
(`actors/telemetry/span_sink.py` writes them, msgpack-encoded, to
`actors/telemetry/span_export.py`), which turns them into the SDK's `ReadableSpan`s
(`to_readable_span`) and exports OTLP. Building SDK spans, encoding protobuf and talking HTTP
then happen on another core, not on the event loop that feeds the engine: with the SDK
in-process, tracing cost a request ~520 µs of worker CPU.

Trace ids travel as 32 hex digits (as in `traceparent`; msgpack integers stop at 64 bits),
span ids as integers.
"""

from __future__ import annotations

import random

import msgspec
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.span import TraceState

from actors.telemetry.span_link import AttributeValue, SpanLink

SCOPE = InstrumentationScope("tokenmill.worker")
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)


class SpanRecord(msgspec.Struct, array_like=True, gc=False):
    """One finished, sampled span."""

    name: str
    kind: int  # SpanKind's value: 0 internal, 3 producer, 4 consumer
    trace_id: str  # 32 hex digits
    span_id: int
    parent_id: int  # 0: a root span
    parent_remote: bool  # the parent came in a message's headers
    start_ns: int
    end_ns: int
    attributes: dict[str, AttributeValue]
    links: list[SpanLink] = []
    error: str | None = None  # status ERROR with this description; None: status unset
    trace_state: str = ""  # the incoming `tracestate` header, passed on unchanged


def new_span_id() -> int:
    """A random non-zero 64-bit span id (as the SDK's RandomIdGenerator makes them)."""
    return random.getrandbits(64) or 1


def new_trace_id() -> str:
    return f"{random.getrandbits(128) or 1:032x}"


encode_records = msgspec.msgpack.Encoder().encode
decode_records = msgspec.msgpack.Decoder(list[SpanRecord]).decode


def to_readable_span(record: SpanRecord, resource: Resource) -> ReadableSpan:
    """The SDK's export form of `record` (what any OTLP exporter takes)."""
    trace_id = int(record.trace_id, 16)
    state = TraceState.from_header([record.trace_state]) if record.trace_state else None
    context = SpanContext(trace_id, record.span_id, False, _SAMPLED, state)
    parent = None
    if record.parent_id:
        parent = SpanContext(trace_id, record.parent_id, record.parent_remote, _SAMPLED, state)
    links = [
        Link(
            SpanContext(int(link.trace_id, 16), link.span_id, True, trace_flags=_SAMPLED),
            link.attributes or None,
        )
        for link in record.links
    ]
    status = Status(StatusCode.ERROR, record.error) if record.error is not None else Status()
    return ReadableSpan(
        record.name,
        context=context,
        parent=parent,
        resource=resource,
        attributes=record.attributes,
        links=links,
        kind=SpanKind(record.kind),
        status=status,
        start_time=record.start_ns,
        end_time=record.end_ns,
        instrumentation_scope=SCOPE,
    )
