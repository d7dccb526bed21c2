"""The gateway's Prometheus metrics, served on its own `/metrics` (a registry of its own)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class GatewayMetrics:
    """Requests by endpoint and status, their latency, those in flight, dropped results."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "tokenmill_gateway_requests",
            "HTTP requests answered, by endpoint, status and error code ('' when none).",
            ["endpoint", "status", "code"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "tokenmill_gateway_request_seconds",
            "From the request's arrival to its answer (a stream: to its last event).",
            ["endpoint", "stream"],
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 600),
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "tokenmill_gateway_in_flight",
            "Requests sent and not answered yet.",
            registry=self.registry,
        )
        self.dropped = Gauge(
            "tokenmill_gateway_results_dropped",
            "Results that arrived for a request whose client had gone (a running total).",
            registry=self.registry,
        )
        self.batches_running = Gauge(
            "tokenmill_gateway_batches_running",
            "Batches (/v1/batches) this instance runs now.",
            registry=self.registry,
        )
