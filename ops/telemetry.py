"""Tracing setup for a process: an OpenTelemetry tracer provider exporting OTLP over HTTP.

    provider = setup_tracing("tokenmill", instance_id="host-17")   # None when tracing is off
    ...
    shutdown_tracing(provider)                                      # flushes, bounded

Tracing is on when an OTLP endpoint is configured (`OTEL_EXPORTER_OTLP_ENDPOINT` or
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, e.g. the `tokenmill up --jaeger` one) and
`OTEL_SDK_DISABLED` is not true. Every standard `OTEL_*` variable is honoured: the sampler
(`OTEL_TRACES_SAMPLER`, default parent-based always-on; `parentbased_traceidratio` with
`OTEL_TRACES_SAMPLER_ARG` for a ratio), the batch processor's queue and delays. Spans are
exported from a background thread through a bounded queue: when the collector is down or
slow, spans are dropped, and request processing never waits for them.
"""

from __future__ import annotations

import os

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

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
