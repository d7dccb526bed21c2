"""Bounds on what a span may carry, and what one costs while it waits to be exported.

Much of a request's span comes from the request itself: its id, the model it names, its Kafka
record's key, the reply topic. A hostile or broken producer can make any of them megabytes long,
and an integer it sends may lie outside the int64 range of an OTLP attribute (the exporter drops
such an attribute, logging an error for every span; beyond 64 bits msgpack, the sink's wire
format, cannot encode it and the whole frame of spans is lost). So every span record is bounded
(`bound_record`) before the recorder hands it on:

- strings (attribute values, list items, the span's name, its status description) keep at most
  `MAX_TEXT_CHARS` characters; a longer one keeps its first `MAX_TEXT_CHARS - 1` and ends in
  `…`. Bytes (a record's key) are decoded as UTF-8 (invalid bytes replaced) and cut the same
  way (`text_of_bytes`);
- integers are clamped to the int64 range (booleans are kept as they are);
- lists keep at most `MAX_LIST_ITEMS` items;
- floats are kept as they are: OTLP encodes NaN and infinities.

`estimated_bytes(record)` is what the span sink's byte budget counts for a queued record: its
strings' lengths (name, attribute keys and values, links' attributes, status, tracestate), 8 per
number, plus `RECORD_OVERHEAD_BYTES` for its ids, times and framing. An estimate of the encoded
size, not of Python's memory: it grows with what a request can make long, which is what the
budget must hold back.
"""

from __future__ import annotations

from actors.telemetry.span_link import AttributeValue, SpanLink
from actors.telemetry.span_records import SpanRecord

MAX_TEXT_CHARS = 256
MAX_LIST_ITEMS = 32
ELLIPSIS = "…"
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
RECORD_OVERHEAD_BYTES = 128  # trace, span and parent ids, times, kind, msgpack's framing
LINK_OVERHEAD_BYTES = 48  # trace and span ids
NUMBER_BYTES = 8


def bound_text(text: str, limit: int = MAX_TEXT_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + ELLIPSIS


def text_of_bytes(data: bytes, limit: int = MAX_TEXT_CHARS) -> str:
    """`data` as bounded text; only its first bytes are decoded (at most 4 per character kept,
    so a cut one still ends in the ellipsis)."""
    return bound_text(data[: 4 * (limit + 1)].decode("utf-8", "replace"), limit)


def bound_value(value: AttributeValue) -> AttributeValue:
    # Exact types first, as cheap as can be: this runs for every attribute of every span.
    if type(value) is str:
        return value if len(value) <= MAX_TEXT_CHARS else bound_text(value)
    if type(value) is int:
        return value if INT64_MIN <= value <= INT64_MAX else min(max(value, INT64_MIN), INT64_MAX)
    if isinstance(value, bool | float):
        return value
    if isinstance(value, str):  # a StrEnum
        return bound_text(value)
    if isinstance(value, int):  # an IntEnum
        return min(max(value, INT64_MIN), INT64_MAX)
    return [bound_text(item) for item in value[:MAX_LIST_ITEMS]]


def bound_attributes(attributes: dict[str, AttributeValue]) -> dict[str, AttributeValue]:
    return {key: bound_value(value) for key, value in attributes.items()}


def bound_record(record: SpanRecord) -> SpanRecord:
    """`record` with every string, integer and list within bounds (changed in place)."""
    record.name = bound_text(record.name)
    attributes = record.attributes
    for key, value in attributes.items():  # in place: most values are within bounds already
        if (bounded := bound_value(value)) is not value:
            attributes[key] = bounded
    if record.error is not None:
        record.error = bound_text(record.error)
    if any(link.attributes for link in record.links):
        record.links = [
            SpanLink(link.trace_id, link.span_id, bound_attributes(link.attributes))
            for link in record.links
        ]
    return record


def estimated_bytes(record: SpanRecord) -> int:
    size = RECORD_OVERHEAD_BYTES + len(record.name) + len(record.trace_state)
    size += _attributes_bytes(record.attributes) + len(record.error or "")
    for link in record.links:
        size += LINK_OVERHEAD_BYTES + _attributes_bytes(link.attributes)
    return size


def _attributes_bytes(attributes: dict[str, AttributeValue]) -> int:
    size = 0
    for key, value in attributes.items():
        size += len(key)
        if isinstance(value, str):
            size += len(value)
        elif isinstance(value, list):
            size += sum(len(item) for item in value)
        else:
            size += NUMBER_BYTES
    return size
