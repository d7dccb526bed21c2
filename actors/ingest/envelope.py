"""Envelope: a request record's headers, read once at the door and carried to its answer.

    envelope = Envelope.of(record)   # the one pass over the record's headers
    envelope.content_type            # the wire format (normalised), for the request and result
    envelope.trace                   # its trace context: the W3C headers to pass on, their parent
    envelope.trace_ids               # (trace id, span id) for the request's log lines
    envelope.attempts                # which attempt of its request it is (`messages.attempts`)
    envelope.kind                    # generation or embedding (`messages.request_kinds`)

Everything after the door (refusals, the admitted request, its outcome) takes these values
from the envelope instead of reading the headers again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from actors.kafka import record_reader
from actors.mail import RecordRef
from actors.telemetry.trace_context import TraceContext
from messages import headers as h
from messages.attempts import Attempts, read_attempts
from messages.codec import JSON, normalize_content_type
from messages.errors import UnsupportedContentType
from messages.headers import Headers
from messages.request_kinds import RequestKind, request_kind


@dataclass(frozen=True)
class Envelope:
    record: RecordRef
    headers: Headers  # the readable ones (`record_reader.readable_headers`): a dead letter's
    raw_content_type: bytes | None  # the `content-type` header as sent
    trace: TraceContext  # `traceparent` / `tracestate` and the parent they name
    unreadable: str | None = None  # why the Kafka client could not read the record as sent
    attempts: Attempts = field(default_factory=Attempts)  # 1 unless read from a retry topic
    schema: bytes | None = None  # the `tokenmill-schema` header, if any

    @classmethod
    def of(cls, record: Any) -> Envelope:
        """The envelope of `record` (a `ConsumerRecord` of the requests topic)."""
        headers = record_reader.readable_headers(record.headers)
        ref = RecordRef(record.topic, record.partition, record.offset, record.timestamp, record.key)
        return cls(
            record=ref,
            headers=headers,
            raw_content_type=h.header(headers, h.CONTENT_TYPE),
            trace=TraceContext.of(headers),
            unreadable=record_reader.unreadable(record),
            attempts=read_attempts(headers),
            schema=h.header(headers, h.SCHEMA),
        )

    @property
    def content_type(self) -> str:
        """The request's wire format; `UnsupportedContentType` when it names none we speak."""
        return normalize_content_type(self.raw_content_type)

    @property
    def reply_content_type(self) -> str:
        """The format of a refusal's result: the request's, or JSON when it has none we speak."""
        try:
            return self.content_type
        except UnsupportedContentType:
            return JSON

    def kind(self, value: bytes | None) -> RequestKind:
        """Which request the record's `value` is: its schema header's kind, else the body's
        (`messages.request_kinds.request_kind`); a generation request when its content type is
        none we speak (it is refused as one)."""
        try:
            content_type = self.content_type
        except UnsupportedContentType:
            return "generate"
        return request_kind(value, content_type, self.schema)

    @property
    def trace_ids(self) -> tuple[str, str]:
        return self.trace.ids
