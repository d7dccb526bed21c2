"""Swaps, restarts and refused commands as spans, beside the events that report them.

Each event a worker publishes (`messages/events.py`) that describes something with a duration
or a failure is also recorded as a span in a trace of its own, so an operator finds a swap's
load, smoke test and flip, or a crashed actor's restart, in Jaeger next to the requests it
affected (service `tokenmill`, span names `model swap`, `restart <child>`, `command refused`).
Spans are recorded after the fact from the event's own times, through the same recorder as
the requests' (`actors/telemetry/tracing.py`); with none installed, nothing is done.
"""

from __future__ import annotations

import structlog

from actors.runtime import Address
from actors.telemetry.span_link import AttributeValue
from actors.telemetry.tracing import SpanRecorder, installed_span_recorder
from messages.events import ChildRestarted, CommandRefused, Event, ModelSwapFailed, ModelSwapped

log = structlog.get_logger("tokenmill.events")


def record_event_span(event: Event, recorder: SpanRecorder | None = None) -> None:
    """Record `event` as a span if it is a swap, a failed swap, a restart or a refusal.

    `recorder`: the installed one unless given (tests give their own)."""
    recorder = recorder or installed_span_recorder()
    if recorder is None:
        return
    end_ns = int(event.at * 1e9)
    attributes: dict[str, AttributeValue] = {"tokenmill.worker": event.worker}
    if event.command:
        attributes["tokenmill.command.nonce"] = event.command
    error: str | None = None
    if isinstance(event, ModelSwapped):
        name = "model swap"
        took_ms = (
            event.pause_ms if event.drained else event.load_ms + event.smoke_ms + event.flip_ms
        )
        attributes |= {
            "tokenmill.swap.from_model": event.from_model.name,
            "tokenmill.swap.to_model": event.to_model.name,
            "tokenmill.model.digest": event.to_model.digest,
            "tokenmill.swap.load_ms": event.load_ms,
            "tokenmill.swap.smoke_ms": event.smoke_ms,
            "tokenmill.swap.flip_ms": event.flip_ms,
            "tokenmill.swap.drained": event.drained,
            "tokenmill.swap.pause_ms": event.pause_ms,
        }
    elif isinstance(event, ModelSwapFailed):
        name, took_ms, error = "model swap", 0.0, event.reason
        attributes |= {"tokenmill.swap.to_model": event.to_model, "error.type": "swap_failed"}
    elif isinstance(event, ChildRestarted):
        name, took_ms, error = f"restart {event.child}", event.backoff_ms, event.error
        attributes |= {
            "tokenmill.child": event.child,
            "tokenmill.restarts": event.restarts,
            "error.type": "child_crashed",
        }
    elif isinstance(event, CommandRefused):
        name, took_ms, error = "command refused", 0.0, event.reason
        attributes["error.type"] = event.reason.split(":", 1)[0]
    else:
        return
    recorder.record_root(name, end_ns - int(took_ms * 1e6), end_ns, attributes, error=error)


def publish_event(events: Address[Event] | None, event: Event) -> None:
    """Record `event`'s span and hand it to the events publisher (the control actor) without
    waiting: when that actor is missing, stopped or its mailbox full, the event is dropped
    and logged rather than holding up a swap, a restart or a drain."""
    record_event_span(event)
    if events is None:
        return
    if not events.try_send(event) and not events.closed:
        log.warning("event_dropped", type=type(event).__name__)
