"""Trace continuation: the caller's `traceparent` in, the gateway's span, the record's header out.

With tracing set up (an OTLP endpoint, `ops/worker/telemetry.setup_tracing`), each generation
call gets a span for its round trip: `gateway /v1/...` under the HTTP server span FastAPI makes
itself (a child of the caller's W3C trace context), or, where no span is current, a SERVER span
`POST /v1/...` that continues the caller's context itself (else starts a trace). The request's
Kafka record carries that span's context, so the worker's spans join it: one trace HTTP → Kafka
→ worker. Without tracing, the
caller's own context (when well formed) goes on the record unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from ops.gateway.errors import ApiError
from ops.gateway.replies import trace_headers

_propagator = TraceContextTextMapPropagator()


@contextmanager
def request_span(
    url: str,
    request_id: str,
    traceparent: str | None,
    tracestate: str | None,
    tracer: trace.Tracer | None = None,
) -> Iterator[list[tuple[str, bytes]]]:
    """The span of one call (None `tracer`: the process's, when tracing is set up); yields
    the trace headers for the request's record."""
    incoming = trace_headers(traceparent, tracestate)
    if tracer is None:
        if not _tracing_set_up():
            yield incoming
            return
        tracer = trace.get_tracer("tokenmill.gateway")
    attributes = {"url.path": url, "tokenmill.request_id": request_id}
    if trace.get_current_span().get_span_context().is_valid:
        # FastAPI's own server span (FastAPI 0.16x traces requests when a tracer provider is
        # set), itself a child of the caller's context: the round trip nests under it.
        name, kind, parent = f"gateway {url}", SpanKind.INTERNAL, None
    else:
        attributes["http.request.method"] = "POST"
        name, kind = f"POST {url}", SpanKind.SERVER
        parent = _propagator.extract({k: v.decode() for k, v in incoming})
    with tracer.start_as_current_span(
        name, context=parent, kind=kind, attributes=attributes
    ) as span:
        carrier: dict[str, str] = {}
        _propagator.inject(carrier)
        try:
            yield [(key, value.encode()) for key, value in carrier.items()]
        except ApiError as exc:
            span.set_attribute("http.response.status_code", exc.status)
            if exc.status >= 500:
                span.set_status(Status(StatusCode.ERROR, exc.code or ""))
            raise


def _tracing_set_up() -> bool:
    provider = trace.get_tracer_provider()
    return not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)
