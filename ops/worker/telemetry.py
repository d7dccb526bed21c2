"""Tracing setup for a process: OTLP over HTTP, when an endpoint is configured.

    provider = setup_tracing("tokenmill-cli")      # CLI: an SDK tracer provider (None: off)
    shutdown_tracing(provider)                      # flushes, bounded

    sink = setup_worker_tracing("tokenmill", instance_id="host-17")   # worker (None: off)
    shutdown_worker_tracing(sink)                                      # flushes, bounded

A CLI makes a span per request it sends and uses the SDK in-process. A worker records five
spans per request, which the SDK would cost ~500 µs of its event loop's CPU; it records them
as plain records instead (`actors/telemetry/tracing.py`) and a span export process of its own
(`actors/telemetry/span_export.py`, fed by `actors/telemetry/span_sink.py`) builds and
exports the SDK's spans.

Tracing is on when an OTLP endpoint is configured (`OTEL_EXPORTER_OTLP_ENDPOINT` or
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, e.g. the `tokenmill up --jaeger` one) and
`OTEL_SDK_DISABLED` is not true. Every standard `OTEL_*` variable is honoured: the sampler
(`OTEL_TRACES_SAMPLER`, default parent-based always-on; `parentbased_traceidratio` with
`OTEL_TRACES_SAMPLER_ARG` for a ratio), the exporter's endpoint, headers and timeout, the CLI's
batch processor's queue and delays. Spans leave through a bounded queue (the CLI's batch
processor, the worker's sink): when the collector is down or slow, spans are dropped, and
request processing never waits for them.
"""

from __future__ import annotations

import os
import sys

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from actors.telemetry.span_sink import SpanSink
from actors.telemetry.tracing import SpanRecorder, install_span_recorder

_ENDPOINTS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


def tracing_configured() -> bool:
    disabled = os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"
    return not disabled and any(os.environ.get(name) for name in _ENDPOINTS)


def setup_tracing(service_name: str, *, instance_id: str | None = None) -> TracerProvider | None:
    """Install a global tracer provider for this process, or do nothing (None) when no
    OTLP endpoint is configured. `OTEL_SERVICE_NAME` overrides `service_name`."""
    if not tracing_configured():
        return None
    attributes = {"service.name": os.environ.get("OTEL_SERVICE_NAME") or service_name}
    if instance_id:
        attributes["service.instance.id"] = instance_id
    provider = TracerProvider(resource=Resource.create(attributes))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    return provider


def shutdown_tracing(provider: TracerProvider | None) -> None:
    """Export what is queued (bounded by the exporter's timeout) and stop."""
    if provider is not None:
        provider.shutdown()


def setup_worker_tracing(service_name: str, *, instance_id: str) -> SpanSink | None:
    """Start the worker's span export process and install the recorder that feeds it, or do
    nothing (None) when no OTLP endpoint is configured. `OTEL_SERVICE_NAME` overrides
    `service_name`; the sampler is the one `OTEL_TRACES_SAMPLER` names (the SDK's rules)."""
    if not tracing_configured():
        return None
    service = os.environ.get("OTEL_SERVICE_NAME") or service_name
    argv = [sys.executable, "-m", "actors.telemetry.span_export", "--service", service]
    sink = SpanSink([*argv, "--instance", instance_id])
    sink.start()
    install_span_recorder(SpanRecorder(TracerProvider().sampler, sink.record, sink.counts))
    return sink


def shutdown_worker_tracing(sink: SpanSink | None, timeout: float = 5.0) -> None:
    """Stop recording, hand on what is queued and let the export process send it (bounded)."""
    if sink is not None:
        install_span_recorder(None)
        sink.close(timeout)
