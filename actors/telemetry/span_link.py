"""SpanLink: a link from one span to another, as span records and in-process messages carry it.

A value type of its own (msgspec only) so that `actors.mail` can carry one without importing
the span machinery.
"""

from __future__ import annotations

import msgspec

AttributeValue = str | int | float | bool | list[str]


class SpanLink(msgspec.Struct, array_like=True, frozen=True, gc=False):
    trace_id: str  # 32 hex digits
    span_id: int
    attributes: dict[str, AttributeValue] = {}
