"""Traces, logs and metrics of the worker: request spans, span records and their export process,
trace context, lifecycle spans, request logs, Prometheus metrics, GPU utilization."""
