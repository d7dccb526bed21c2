"""W3C traceparent parsing and writing (actors/telemetry/trace_context.py), by the spec's rules."""

from __future__ import annotations

import pytest

from actors.telemetry.trace_context import incoming_parent, outgoing_headers

TRACE = "0af7651916cd43dd8448eb211c80319c"


def test_a_valid_traceparent_and_its_tracestate_are_read() -> None:
    parent = incoming_parent(
        [("traceparent", f"00-{TRACE}-b7ad6b7169203331-01".encode()), ("tracestate", b"a=1")]
    )
    assert parent is not None
    assert (parent.trace_id, parent.span_id) == (TRACE, 0xB7AD6B7169203331)
    assert parent.sampled and parent.state == "a=1"


def test_a_later_version_may_carry_more_fields() -> None:
    parent = incoming_parent([("traceparent", f"01-{TRACE}-b7ad6b7169203331-00-extra".encode())])
    assert parent is not None and not parent.sampled


@pytest.mark.parametrize(
    "value",
    [
        f"ff-{TRACE}-b7ad6b7169203331-01",  # forbidden version
        f"00-{TRACE}-b7ad6b7169203331-01-extra",  # version 00 has four fields
        f"00-{'0' * 32}-b7ad6b7169203331-01",  # zero trace id
        f"00-{TRACE}-{'0' * 16}-01",  # zero span id
        f"00-{TRACE.upper()}-b7ad6b7169203331-01",  # upper case
        "garbage",
        "",
    ],
)
def test_an_invalid_traceparent_is_no_parent(value: str) -> None:
    assert incoming_parent([("traceparent", value.encode())]) is None


def test_no_header_is_no_parent() -> None:
    assert incoming_parent([]) is None


def test_outgoing_headers_round_trip() -> None:
    headers = outgoing_headers(TRACE, 42, sampled=True, state="a=1")
    parent = incoming_parent(headers)
    assert parent is not None
    assert (parent.trace_id, parent.span_id, parent.sampled, parent.state) == (
        TRACE,
        42,
        True,
        "a=1",
    )


def test_an_invalid_tracestate_is_dropped_and_a_valid_one_normalised() -> None:
    parent = f"00-{TRACE}-b7ad6b7169203331-01".encode()
    bad = incoming_parent([("traceparent", parent), ("tracestate", b"A=1")])
    assert bad is not None and bad.state == ""
    good = incoming_parent([("traceparent", parent), ("tracestate", b"a=1,,b=2")])
    assert good is not None and good.state == "a=1,b=2"
