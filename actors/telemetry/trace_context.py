"""W3C Trace Context in Kafka headers: read a request's parent, write a result's.

    trace = TraceContext.of(headers)        # once, at the door: carried to the result
    trace.parent                            # None: no valid traceparent, the request starts a trace
    parent = incoming_parent(headers)       # the parse itself
    outgoing_headers(parent.trace_id, span_id, sampled=True, state=parent.state)

The same rules as OpenTelemetry's TraceContext propagator (version `ff` and all-zero ids are
invalid, version 00 has exactly four fields, a later version may have more), written out so the
worker's hot path builds no OpenTelemetry context objects.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from opentelemetry.trace.span import TraceState

from messages import headers as h
from messages.headers import Headers

_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
_ZERO_TRACE = "0" * 32


@dataclass(frozen=True, slots=True)
class Parent:
    """The span a request's producer sent it from."""

    trace_id: str  # 32 hex digits
    span_id: int
    sampled: bool
    state: str  # the `tracestate` header, normalised; "" without one or when invalid


@dataclass(frozen=True, slots=True)
class TraceContext:
    """A request's trace context, read once from its record's headers and carried with it to
    its result: the W3C headers to pass on (within their size limits) and the parent they name."""

    headers: Headers = field(default_factory=list)  # `traceparent` / `tracestate`
    parent: Parent | None = None  # None: no valid traceparent

    @classmethod
    def of(cls, headers: Headers) -> TraceContext:
        """The trace context of a record with `headers` (all of them, or only the trace ones)."""
        trace = h.trace_headers(headers)
        return cls(trace, incoming_parent(trace))

    @property
    def ids(self) -> tuple[str, str]:
        """(trace id, span id) in hex for the request's log lines; "" without a parent."""
        if self.parent is None:
            return "", ""
        return self.parent.trace_id, f"{self.parent.span_id:016x}"


def incoming_parent(headers: Headers) -> Parent | None:
    value = h.header(headers, h.TRACEPARENT)
    if value is None:
        return None
    match = _TRACEPARENT.fullmatch(value.decode("latin-1").strip())
    if match is None:
        return None
    version, trace_id, span_id, flags, rest = match.groups()
    span = int(span_id, 16)
    if version == "ff" or (version == "00" and rest) or trace_id == _ZERO_TRACE or not span:
        return None
    state = h.header(headers, h.TRACESTATE)
    return Parent(
        trace_id=trace_id,
        span_id=span,
        sampled=bool(int(flags, 16) & 1),
        state=_valid_state(state.decode("latin-1")) if state else "",
    )


def _valid_state(header: str) -> str:
    """`tracestate` as OpenTelemetry keeps it: normalised, or "" when invalid (dropped)."""
    return TraceState.from_header([header]).to_header()


def outgoing_headers(trace_id: str, span_id: int, *, sampled: bool, state: str = "") -> Headers:
    """The trace headers that make `span_id` the parent of whoever consumes the message."""
    headers = [
        (h.TRACEPARENT, f"00-{trace_id}-{span_id:016x}-{'01' if sampled else '00'}".encode())
    ]
    if state:
        headers.append((h.TRACESTATE, state.encode("latin-1")))
    return headers
