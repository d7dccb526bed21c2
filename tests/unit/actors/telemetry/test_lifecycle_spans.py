"""Swaps, failed swaps, restarts and refused commands recorded as spans from their events."""

from __future__ import annotations

from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import StatusCode

from actors.telemetry.lifecycle_spans import record_event_span
from messages.events import (
    ChildRestarted,
    CommandRefused,
    ModelSwapFailed,
    ModelSwapped,
    StatusReply,
)
from messages.result import ModelRef
from tests.unit.span_capture import SpanCapture

A, B = ModelRef(name="a", digest="sha256:a"), ModelRef(name="b", digest="sha256:b")
AT = 1_800_000_000.0


def recorded(*events: object) -> list:
    capture = SpanCapture()
    for event in events:
        record_event_span(event, capture.recorder)  # type: ignore[arg-type]
    return capture.spans()


def test_a_swap_spans_its_load_smoke_test_and_flip() -> None:
    (span,) = recorded(
        ModelSwapped(
            worker="w",
            at=AT,
            command="n1",
            from_model=A,
            to_model=B,
            load_ms=900.0,
            smoke_ms=90.0,
            flip_ms=10.0,
        )
    )
    assert span.name == "model swap"
    assert span.end_time == int(AT * 1e9)
    assert span.end_time - span.start_time == 1_000_000_000
    assert span.attributes["tokenmill.swap.to_model"] == "b"
    assert span.attributes["tokenmill.command.nonce"] == "n1"
    assert span.status.status_code is StatusCode.UNSET


def test_failures_and_restarts_are_error_spans() -> None:
    spans = recorded(
        ModelSwapFailed(worker="w", at=AT, to_model="c", reason="truncated"),
        ChildRestarted(worker="w", at=AT, child="gpu", error="boom", restarts=1, backoff_ms=100),
        CommandRefused(worker="w", at=AT, reason="replayed: nonce seen"),
    )
    assert [s.name for s in spans] == ["model swap", "restart gpu", "command refused"]
    assert all(s.status.status_code is StatusCode.ERROR for s in spans)
    assert [s.attributes["error.type"] for s in spans] == [
        "swap_failed",
        "child_crashed",
        "replayed",
    ]


def test_other_events_no_recorder_and_unsampled_traces_record_nothing() -> None:
    status = StatusReply(
        worker="w",
        at=AT,
        model=A,
        uptime_s=1,
        queued=0,
        running=0,
        kv_blocks_used=0,
        kv_blocks_total=1,
    )
    assert recorded(status) == []
    record_event_span(status)  # no recorder installed: a no-op, no error
    dropped = SpanCapture(ALWAYS_OFF)
    record_event_span(
        ModelSwapFailed(worker="w", at=AT, to_model="c", reason="x"), dropped.recorder
    )
    assert dropped.records == []
