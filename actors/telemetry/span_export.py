"""The worker's span export process: span records in on stdin, OTLP out.

    python -m actors.telemetry.span_export --service tokenmill --instance worker-1

Started by the worker (`ops/worker/telemetry.py` → `actors/telemetry/span_sink.py`), never by
hand. It reads length-prefixed msgpack frames of `SpanRecord`s until its stdin closes (the
worker stopped or died), turns each frame into the SDK's `ReadableSpan`s and exports them with
the SDK's OTLP exporter, which reads every standard `OTEL_EXPORTER_OTLP_*` variable (endpoint,
headers, timeout). A failed export is logged by the exporter and its spans dropped; the next
frame is tried as usual. Ctrl-C in a terminal reaches the whole process group: this process
ignores it and finishes with its input instead, so the worker's last spans still go out."""

from __future__ import annotations

import argparse
import signal
import sys
from typing import BinaryIO

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export import SpanExporter

from actors.telemetry.span_records import decode_records, to_readable_span
from actors.telemetry.span_sink import FRAME_HEADER_BYTES


def export_frames(source: BinaryIO, exporter: SpanExporter, resource: Resource) -> int:
    """Export every frame read from `source` until it ends; returns the spans read."""
    spans = 0
    while len(header := source.read(FRAME_HEADER_BYTES)) == FRAME_HEADER_BYTES:
        size = int.from_bytes(header, "big")
        payload = source.read(size)
        if len(payload) < size:
            break  # the worker died mid-frame
        try:
            records = decode_records(payload)
            spans += len(records)
            exporter.export([to_readable_span(record, resource) for record in records])
        except Exception as exc:  # one bad frame costs its spans, not the process
            print(f"span_export: frame dropped: {exc!r}", file=sys.stderr)
    return spans


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m actors.telemetry.span_export")
    parser.add_argument("--service", required=True)
    parser.add_argument("--instance")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # also in a session of its own (span_sink)
    attributes = {"service.name": args.service}
    if args.instance:
        attributes["service.instance.id"] = args.instance
    exporter = OTLPSpanExporter()
    try:
        export_frames(sys.stdin.buffer, exporter, Resource.create(attributes))
    finally:
        exporter.shutdown()  # type: ignore[no-untyped-call]


if __name__ == "__main__":
    main()
