"""Spans sent to Jaeger as OTLP/HTTP JSON, the way any OpenTelemetry exporter sends them."""

from __future__ import annotations

import json
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from ops.services.jaeger import LocalJaeger


@dataclass
class Span:
    trace_id: str  # 32 hex
    span_id: str  # 16 hex
    name: str
    parent_id: str = ""
    kind: int = 1  # INTERNAL; 3 SERVER... 4 PRODUCER, 5 CONSUMER
    start_ms_ago: float = 10.0
    duration_ms: float = 1.0
    attributes: dict[str, str | int | bool] = field(default_factory=dict)

    def otlp(self) -> dict[str, Any]:
        start = time.time_ns() - int(self.start_ms_ago * 1e6)
        return {
            "traceId": self.trace_id,
            "spanId": self.span_id,
            "parentSpanId": self.parent_id,
            "name": self.name,
            "kind": self.kind,
            "startTimeUnixNano": str(start),
            "endTimeUnixNano": str(start + int(self.duration_ms * 1e6)),
            "attributes": [_attribute(k, v) for k, v in self.attributes.items()],
        }


def _attribute(key: str, value: str | int | bool) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"key": key, "value": {"boolValue": value}}
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}
    return {"key": key, "value": {"stringValue": value}}


def send(jaeger: LocalJaeger, service: str, spans: list[Span]) -> int:
    """POST the spans as one resource (`service.name` = `service`); the HTTP status."""
    body = {
        "resourceSpans": [
            {
                "resource": {
                    "attributes": [{"key": "service.name", "value": {"stringValue": service}}]
                },
                "scopeSpans": [
                    {"scope": {"name": "tests.e2e"}, "spans": [s.otlp() for s in spans]}
                ],
            }
        ]
    }
    request = urllib.request.Request(
        f"{jaeger.otlp_http}/v1/traces",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as reply:
        return int(reply.status)
