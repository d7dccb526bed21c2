"""A request's spans in the worker, recorded when its result is sent, from what it carries.

The emitter calls `start_request_spans(outcome, ...)` just before producing a result. From the
request's own trace headers (the producer's `traceparent`, or none: a new trace) and the
result's timings it records, with explicit start and end times:

    process <requests topic>   CONSUMER   consumed → result acknowledged
      queue                               consumed → admitted to the engine
      prefill                             admitted → first token
      decode                              first token → last token
      send <reply topic>       PRODUCER   produced → acknowledged (its context goes into the
                                          result's headers, so consumers continue the trace)

The GPU actor records one `batch` span per flushed length bucket as it admits it
(`record_batch_span`: bucket, size, tokens, flush reason), in a trace of its own with a link to
each member's incoming context; each member's `process` span links back to it.

Nothing is traced inside the engine or on the hot path of a step: the engine's per-request
timings become spans afterwards. With no tracer provider set up (`ops/telemetry.py`), every
span is a no-op and the request's own trace headers pass through unchanged.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanContext, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from actors.mail import Batch, Headers, Outcome
from messages.request import GenerateRequest

REQUEST_ID_ATTRIBUTE = "tokenmill.request_id"  # what `tokenmill trace` searches by

_propagator = TraceContextTextMapPropagator()
_NOT_SET_UP = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)


def tracing_active(provider: trace.TracerProvider | None = None) -> bool:
    """Whether this process has set up a tracer provider (`ops/telemetry.py`); when not,
    callers skip span work altogether rather than make no-op spans."""
    return not isinstance(provider or trace.get_tracer_provider(), _NOT_SET_UP)


def worker_tracer(provider: trace.TracerProvider) -> trace.Tracer:
    """The worker's tracer from `provider`, made once (the SDK builds a new one per call,
    which cost about a sixth of a request's span work)."""
    cached = _tracers.get(id(provider))
    if cached is None or cached[0] is not provider:
        cached = (provider, provider.get_tracer("tokenmill.worker"))
        _tracers[id(provider)] = cached
    return cached[1]


_tracers: dict[int, tuple[trace.TracerProvider, trace.Tracer]] = {}


@dataclass
class RequestSpans:
    """The spans still open while a result is on its way to the broker."""

    process: Span
    send: Span
    headers: Headers  # the trace headers to put on the result

    def end(self, error: BaseException | None = None) -> None:
        now = time.time_ns()
        if error is not None:
            for span in (self.send, self.process):
                span.set_status(Status(StatusCode.ERROR, repr(error)))
                span.set_attribute("error.type", type(error).__name__)
        self.send.end(end_time=now)
        self.process.end(end_time=now)


def start_request_spans(
    outcome: Outcome,
    *,
    group: str,
    now_ns: int | None = None,
    provider: trace.TracerProvider | None = None,
) -> RequestSpans:
    """Open the outcome's `process` and `send` spans and record its finished phases.

    `provider`: the process's global one unless given (tests give their own)."""
    provider = provider or trace.get_tracer_provider()
    if not tracing_active(provider):
        # No tracing in this process: skip the no-op spans (~15 µs a result) altogether.
        return RequestSpans(trace.INVALID_SPAN, trace.INVALID_SPAN, outcome.trace)
    tracer = worker_tracer(provider)
    now = time.time_ns() if now_ns is None else now_ns
    result, record = outcome.result, outcome.record
    timings = result.timings
    consumed = outcome.finished_ns - int(timings.total_ms * 1e6)
    parent = _extract(outcome.trace)
    process = tracer.start_span(
        f"process {record.topic}",
        context=parent,
        kind=SpanKind.CONSUMER,
        start_time=consumed,
        links=[Link(outcome.batch_span)] if outcome.batch_span is not None else [],
        attributes={
            "messaging.system": "kafka",
            "messaging.operation.name": "process",
            "messaging.operation.type": "process",
            "messaging.destination.name": record.topic,
            "messaging.destination.partition.id": str(record.partition),
            "messaging.kafka.offset": record.offset,
            "messaging.kafka.message.key": (record.key or b"").decode("utf-8", "replace"),
            "messaging.consumer.group.name": group,
            REQUEST_ID_ATTRIBUTE: result.id,
            "gen_ai.operation.name": _operation(outcome.request),
            "gen_ai.provider.name": "tokenmill",
            "gen_ai.usage.input_tokens": result.usage.prompt_tokens,
            "gen_ai.usage.output_tokens": result.usage.completion_tokens,
            "gen_ai.response.finish_reasons": [str(result.finish_reason)],
        },
    )
    if result.model is not None:
        process.set_attribute("gen_ai.response.model", result.model.name)
        process.set_attribute("tokenmill.model.digest", result.model.digest)
    if outcome.request is not None:
        process.set_attributes(_request_attributes(outcome.request))
    if timings.ttft_ms is not None:
        process.set_attribute("tokenmill.ttft_ms", round(timings.ttft_ms, 3))
    if outcome.admitted:
        process.set_attribute("tokenmill.preemptions", outcome.preemptions)
    if result.error is not None:
        process.set_status(Status(StatusCode.ERROR, result.error.message))
        process.set_attribute("error.type", str(result.error.code))
    inside = trace.set_span_in_context(process)
    if outcome.admitted:
        admitted = consumed + int(timings.queued_ms * 1e6)
        _phase(tracer, "queue", inside, consumed, admitted)
        if timings.ttft_ms is not None:
            first_token = consumed + int(timings.ttft_ms * 1e6)
            _phase(tracer, "prefill", inside, admitted, first_token)
            _phase(tracer, "decode", inside, first_token, outcome.finished_ns)
    send = tracer.start_span(
        f"send {outcome.reply_topic}",
        context=inside,
        kind=SpanKind.PRODUCER,
        start_time=now,
        attributes={
            "messaging.system": "kafka",
            "messaging.operation.name": "send",
            "messaging.operation.type": "send",
            "messaging.destination.name": outcome.reply_topic,
            REQUEST_ID_ATTRIBUTE: result.id,
        },
    )
    return RequestSpans(process, send, _headers_for(send, outcome.trace))


def record_batch_span(
    batch: Batch, provider: trace.TracerProvider | None = None
) -> SpanContext | None:
    """One span for a flushed batch as the GPU actor admits it, linked to each member's
    incoming trace context; its context (None when tracing is off) goes with every member so
    the member's `process` span links back to it."""
    provider = provider or trace.get_tracer_provider()
    if not tracing_active(provider):
        return None
    links = []
    for item in batch.items:
        member = trace.get_current_span(_extract(item.trace)).get_span_context()
        if member.is_valid:
            links.append(Link(member, {REQUEST_ID_ATTRIBUTE: item.request.id}))
    span = worker_tracer(provider).start_span(
        "batch",
        context=Context(),  # a trace of its own: it belongs to every member's trace at once
        links=links,
        attributes={
            "tokenmill.bucket": batch.bucket,
            "tokenmill.batch.size": len(batch.items),
            "tokenmill.batch.tokens": batch.tokens,
            "tokenmill.batch.flush_reason": str(batch.reason),
        },
    )
    span.end()
    return span.get_span_context()


def _operation(request: GenerateRequest | None) -> str:
    return "chat" if request is not None and request.messages is not None else "text_completion"


def _request_attributes(request: GenerateRequest) -> dict[str, str | int | float]:
    attributes: dict[str, str | int | float] = {
        "gen_ai.request.max_tokens": request.max_new_tokens,
        "gen_ai.request.temperature": request.temperature,
        "gen_ai.request.top_p": request.top_p,
    }
    if request.model is not None:
        attributes["gen_ai.request.model"] = request.model
    return attributes


def _extract(headers: Headers) -> Context:
    return _propagator.extract({k: v.decode("latin-1") for k, v in headers})


def _phase(tracer: trace.Tracer, name: str, parent: Context, start: int, end: int) -> None:
    span = tracer.start_span(name, context=parent, start_time=start)
    span.end(end_time=max(start, end))


def _headers_for(send: Span, original: Headers) -> Headers:
    """The send span's context as trace headers; the request's own when it is not recorded."""
    if not send.get_span_context().is_valid:
        return original
    carrier: dict[str, str] = {}
    _propagator.inject(carrier, context=trace.set_span_in_context(send))
    return [(key, value.encode()) for key, value in carrier.items()]
