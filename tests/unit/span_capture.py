"""A span recorder for unit tests: records kept in a list, read back as the SDK's spans.

capture = SpanCapture()                  # samples everything (parent-based always-on)
start_request_spans(outcome, group="g", recorder=capture.recorder).end()
spans = capture.spans()                  # ReadableSpans, as the export process makes them
"""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.sampling import DEFAULT_ON, Sampler

from actors.telemetry.span_records import (
    SpanRecord,
    decode_records,
    encode_records,
    to_readable_span,
)
from actors.telemetry.tracing import SpanRecorder

RESOURCE = Resource.create({"service.name": "tokenmill-test"})


class SpanCapture:
    def __init__(self, sampler: Sampler = DEFAULT_ON) -> None:
        self.records: list[SpanRecord] = []
        self.recorder = SpanRecorder(sampler, self._keep)

    def _keep(self, records: Sequence[SpanRecord]) -> None:
        # Through the wire format, as the export process receives them.
        self.records += decode_records(encode_records(list(records)))

    def spans(self) -> list[ReadableSpan]:
        return [to_readable_span(record, RESOURCE) for record in self.records]

    def by_name(self) -> dict[str, ReadableSpan]:
        return {span.name: span for span in self.spans()}
