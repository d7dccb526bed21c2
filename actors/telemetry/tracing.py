"""A request's spans in the worker, recorded when its result is sent, from what it carries.

The emitter calls `start_request_spans(outcome, ...)` just before producing a result. From the
request's own trace headers (the producer's `traceparent`, or none: a new trace) and the
result's timings it records, with explicit start and end times:

    process <requests topic>   CONSUMER   consumed → result acknowledged
      queue                               consumed → admitted to the engine
      prefill                             admitted → first token
      decode                              first token → last token
      embed                               admitted → vectors made (an embedding request's, in
                                          place of prefill and decode)
      send <reply topic>       PRODUCER   produced → acknowledged (its context goes into the
                                          result's headers, so consumers continue the trace)

The GPU actor records one `batch` span per flushed length bucket as it admits it
(`record_batch_span`: bucket, size, tokens, flush reason), in a trace of its own with a link to
each member's incoming context; each member's `process` span links back to it.

Nothing is traced inside the engine or on the hot path of a step: the engine's per-request
timings become spans afterwards. Spans are plain records (`actors/telemetry/span_records.py`)
bounded (`actors/telemetry/span_bounds.py`: a request's strings cut, its integers clamped) and
handed to the installed `SpanRecorder`'s sink — in a worker, the span export process
(`ops.worker.telemetry.setup_worker_tracing`), which builds the SDK's spans and exports them.
With no recorder installed nothing is recorded and the request's own trace headers pass through.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from opentelemetry import trace
from opentelemetry.sdk.trace.sampling import Decision, Sampler
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.span import TraceState

from actors.mail import Batch, Outcome
from actors.result_shapes import finish_of
from actors.telemetry.span_bounds import bound_record, text_of_bytes
from actors.telemetry.span_link import AttributeValue, SpanLink
from actors.telemetry.span_records import SpanRecord, new_span_id, new_trace_id
from actors.telemetry.trace_context import Parent, outgoing_headers
from messages.embedding import EmbedRequest, EmbedResult
from messages.headers import Headers
from messages.request import GenerateRequest
from messages.request_kinds import Request, Result
from messages.result import FinishReason, Usage

REQUEST_ID_ATTRIBUTE = "tokenmill.request_id"  # what `tokenmill trace` searches by

_INTERNAL, _PRODUCER, _CONSUMER = SpanKind.INTERNAL, SpanKind.PRODUCER, SpanKind.CONSUMER


@dataclass(frozen=True)
class SpanRecorder:
    """Where this process's worker spans go: each trace is kept or not by `sampler` (the
    SDK's, as `OTEL_TRACES_SAMPLER` chose it), kept spans are bounded and handed to `sink`."""

    sampler: Sampler
    sink: Callable[[Sequence[SpanRecord]], None]
    counts: Callable[[], tuple[int, int]] | None = None  # spans (handed on, dropped) so far

    def samples(self, parent: Parent | None, trace_id: str, name: str, kind: SpanKind) -> bool:
        context = None
        if parent is not None:
            state = TraceState.from_header([parent.state]) if parent.state else None
            flags = TraceFlags(TraceFlags.SAMPLED if parent.sampled else TraceFlags.DEFAULT)
            remote = SpanContext(int(trace_id, 16), parent.span_id, True, flags, state)
            context = trace.set_span_in_context(NonRecordingSpan(remote))
        decision = self.sampler.should_sample(context, int(trace_id, 16), name, kind).decision
        return decision is Decision.RECORD_AND_SAMPLE

    def hand_on(self, records: Sequence[SpanRecord]) -> None:
        """Every finished span leaves through here: within bounds, whatever a request holds."""
        self.sink([bound_record(record) for record in records])

    def record_root(
        self,
        name: str,
        start_ns: int,
        end_ns: int,
        attributes: dict[str, AttributeValue],
        links: list[SpanLink] | None = None,
        error: str | None = None,
    ) -> SpanLink | None:
        """A finished span in a trace of its own (a batch, a swap, a restart), if sampled;
        a link to it, or None when it was not kept."""
        trace_id, span_id = new_trace_id(), new_span_id()
        if not self.samples(None, trace_id, name, _INTERNAL):
            return None
        self.hand_on(
            [SpanRecord(name, _INTERNAL.value, trace_id, span_id, 0, False, start_ns, end_ns,
                        attributes, links or [], error)]
        )  # fmt: skip
        return SpanLink(trace_id, span_id)


_installed: SpanRecorder | None = None


def install_span_recorder(recorder: SpanRecorder | None) -> None:
    """Make `recorder` this process's (None: stop recording)."""
    global _installed
    _installed = recorder


def installed_span_recorder() -> SpanRecorder | None:
    return _installed


@dataclass
class RequestSpans:
    """A request's spans, waiting for its result's acknowledgement to end `process` and
    `send`; `headers`: the trace headers to put on the result."""

    headers: Headers
    records: list[SpanRecord]  # `process` first, `send` last; empty when not recorded
    sink: Callable[[Sequence[SpanRecord]], None] | None = None

    def end(self, error: BaseException | None = None) -> None:
        if not self.records or self.sink is None:
            return
        process, send = self.records[0], self.records[-1]
        process.end_ns = send.end_ns = max(time.time_ns(), send.start_ns)
        if error is not None:
            for span in (send, process):
                span.error = repr(error)
                span.attributes["error.type"] = type(error).__name__
        self.sink(self.records)


def start_request_spans(
    outcome: Outcome,
    *,
    group: str,
    now_ns: int | None = None,
    recorder: SpanRecorder | None = None,
) -> RequestSpans:
    """The outcome's spans, all but `process` and `send` finished; and the result's headers.

    `recorder`: the installed one unless given (tests give their own)."""
    recorder = recorder or _installed
    if recorder is None:
        return RequestSpans(outcome.trace.headers, [])
    now = time.time_ns() if now_ns is None else now_ns
    record = outcome.record
    parent = outcome.trace.parent
    trace_id = parent.trace_id if parent is not None else new_trace_id()
    state = parent.state if parent is not None else ""
    send_id = new_span_id()
    process_name = f"process {record.topic}"
    if not recorder.samples(parent, trace_id, process_name, _CONSUMER):
        headers = outgoing_headers(trace_id, send_id, sampled=False, state=state)
        return RequestSpans(headers, [])
    process_id = new_span_id()
    timings = outcome.result.timings
    consumed = outcome.finished_ns - int(timings.total_ms * 1e6)
    process = SpanRecord(
        name=process_name,
        kind=_CONSUMER.value,
        trace_id=trace_id,
        span_id=process_id,
        parent_id=parent.span_id if parent is not None else 0,
        parent_remote=True,
        start_ns=consumed,
        end_ns=now,
        attributes=_process_attributes(outcome, group),
        links=[outcome.batch_span] if outcome.batch_span is not None else [],
        error=outcome.result.error.message if outcome.result.error is not None else None,
        trace_state=state,
    )
    records = [process]

    def child(name: str, kind: SpanKind, start: int, end: int) -> SpanRecord:
        span_id = send_id if kind is _PRODUCER else new_span_id()
        return SpanRecord(
            name, kind.value, trace_id, span_id, process_id, False, start, max(start, end), {},
            trace_state=state,
        )  # fmt: skip

    if outcome.admitted:
        admitted = consumed + int(timings.queued_ms * 1e6)
        records.append(child("queue", _INTERNAL, consumed, admitted))
        result = outcome.result
        if isinstance(result, EmbedResult):
            if result.data:
                embed = child("embed", _INTERNAL, admitted, outcome.finished_ns)
                embed.attributes = {
                    "gen_ai.operation.name": EMBEDDINGS,
                    "gen_ai.usage.input_tokens": result.usage.prompt_tokens,
                    "tokenmill.embed.inputs": len(result.data),
                }
                records.append(embed)
        elif timings.ttft_ms is not None:
            first_token = consumed + int(timings.ttft_ms * 1e6)
            records.append(child("prefill", _INTERNAL, admitted, first_token))
            decode = child("decode", _INTERNAL, first_token, outcome.finished_ns)
            decode.attributes = _decode_attributes(outcome)
            records.append(decode)
    send = child(f"send {outcome.reply_topic}", _PRODUCER, now, now)
    send.attributes = {
        "messaging.system": "kafka",
        "messaging.operation.name": "send",
        "messaging.operation.type": "send",
        "messaging.destination.name": outcome.reply_topic,
        REQUEST_ID_ATTRIBUTE: outcome.result.id,
    }
    records.append(send)
    headers = outgoing_headers(trace_id, send_id, sampled=True, state=state)
    return RequestSpans(headers, records, recorder.hand_on)


def record_batch_span(batch: Batch, recorder: SpanRecorder | None = None) -> SpanLink | None:
    """One span for a flushed batch as the GPU actor admits it, linked to each member's
    incoming trace context; its reference (None when not recorded) goes with every member so
    the member's `process` span links back to it."""
    recorder = recorder or _installed
    if recorder is None:
        return None
    links = []
    for item in batch.items:
        member = item.trace.parent
        if member is not None:
            links.append(
                SpanLink(member.trace_id, member.span_id, {REQUEST_ID_ATTRIBUTE: item.request.id})
            )
    attributes: dict[str, AttributeValue] = {
        "tokenmill.bucket": batch.bucket,
        "tokenmill.batch.size": len(batch.items),
        "tokenmill.batch.tokens": batch.tokens,
        "tokenmill.batch.flush_reason": str(batch.reason),
    }
    now = time.time_ns()
    # A trace of its own: it belongs to every member's trace at once.
    return recorder.record_root("batch", now, now, attributes, links)


def _process_attributes(outcome: Outcome, group: str) -> dict[str, AttributeValue]:
    result, record = outcome.result, outcome.record
    finish = finish_of(result)
    attributes: dict[str, AttributeValue] = {
        "messaging.system": "kafka",
        "messaging.operation.name": "process",
        "messaging.operation.type": "process",
        "messaging.destination.name": record.topic,
        "messaging.destination.partition.id": str(record.partition),
        "messaging.kafka.offset": record.offset,
        "messaging.kafka.message.key": text_of_bytes(record.key or b""),
        "messaging.consumer.group.name": group,
        REQUEST_ID_ATTRIBUTE: result.id,
        "gen_ai.operation.name": _operation(outcome.request, result),
        "gen_ai.provider.name": "tokenmill",
        "gen_ai.usage.input_tokens": result.usage.prompt_tokens,
        "gen_ai.response.finish_reasons": [str(finish)],
    }
    if result.model is not None:
        attributes["gen_ai.response.model"] = result.model.name
        attributes["tokenmill.model.digest"] = result.model.digest
    if isinstance(result, EmbedResult):
        attributes |= _embed_attributes(outcome.request, result)
    else:
        attributes["gen_ai.usage.output_tokens"] = result.usage.completion_tokens
        if outcome.admitted:
            attributes["tokenmill.cached_tokens"] = result.usage.cached_tokens
    request = outcome.request
    if request is not None and not isinstance(request, EmbedRequest):
        attributes["gen_ai.request.max_tokens"] = request.max_new_tokens
        attributes["gen_ai.request.temperature"] = request.temperature
        attributes["gen_ai.request.top_p"] = request.top_p
        if request.model is not None:
            attributes["gen_ai.request.model"] = request.model
        if request.response_format is not None and request.response_format.constrained:
            attributes["tokenmill.response_format"] = request.response_format.type
        if request.structured_output is not None:
            attributes["tokenmill.structured_output"] = request.structured_output.rule()[0]
    if result.timings.ttft_ms is not None:
        attributes["tokenmill.ttft_ms"] = round(result.timings.ttft_ms, 3)
    if outcome.admitted:
        attributes["tokenmill.preemptions"] = outcome.preemptions
        attributes["tokenmill.kv_blocks"] = outcome.kv_blocks
    if result.error is not None:
        attributes["error.type"] = str(result.error.code)
    if finish is FinishReason.CANCELLED:  # aborted in the engine unless it says
        attributes["tokenmill.cancelled_in"] = outcome.cancelled_in or "engine"
    return attributes


def _embed_attributes(request: Request | None, result: EmbedResult) -> dict[str, AttributeValue]:
    """An embedding request's: its vectors' width and count, inputs cut, as the GenAI
    conventions name them where they do."""
    attributes: dict[str, AttributeValue] = {
        "gen_ai.embeddings.dimension.count": result.dimensions,
        "tokenmill.embed.inputs": len(result.data),
        "tokenmill.embed.truncated": result.truncated,
    }
    if isinstance(request, EmbedRequest):
        attributes["gen_ai.request.encoding_formats"] = [request.encoding_format]
        if request.model is not None:
            attributes["gen_ai.request.model"] = request.model
        if request.prompt_name is not None:
            attributes["tokenmill.embed.prompt_name"] = request.prompt_name
    return attributes


def _decode_attributes(outcome: Outcome) -> dict[str, AttributeValue]:
    """Speculative decoding's counts, for a request that had tokens guessed for it."""
    usage = outcome.result.usage
    if not isinstance(usage, Usage):  # an embedding request's: it decodes nothing
        return {}
    drafted = usage.accepted_draft_tokens + usage.rejected_draft_tokens
    if drafted == 0:
        return {}
    return {
        "tokenmill.speculative.draft_tokens": drafted,
        "tokenmill.speculative.accepted_tokens": usage.accepted_draft_tokens,
    }


EMBEDDINGS = "embeddings"  # the GenAI conventions' operation name for an embedding request


def _operation(request: Request | None, result: Result) -> str:
    if isinstance(result, EmbedResult):
        return EMBEDDINGS
    if isinstance(request, GenerateRequest) and request.messages is not None:
        return "chat"
    return "text_completion"
