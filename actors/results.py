"""The outcomes that carry results: a run's, a refusal's, an error's, a dead letter's.

Each result is of its request's kind (`GenerateResult` or `EmbedResult`), made by
`actors.result_shapes` from the engine's `Completion` or from an error.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING

from actors.config import DEAD_LETTER_HEADER_BYTES
from actors.mail import Admitted, CancelledIn, DeadLetter, Outcome, RecordRef
from actors.result_shapes import (
    Stamp,
    completed_result,
    error_result,
    finish_reason,
    stripped,
)
from actors.telemetry.trace_context import TraceContext
from messages import headers as h
from messages.error_codes import DEAD_LETTER_CODES, ErrorCode
from messages.headers import Headers
from messages.limits import MAX_ERROR_MESSAGE_CHARS, MAX_KEY_BYTES, MAX_NAME_CHARS, cut
from messages.request_kinds import Request, RequestKind, Result, kind_of
from messages.result import ErrorInfo, ModelRef, Timings

if TYPE_CHECKING:  # only read here; gpu.engine_io imports torch, which the ingest needs not
    from gpu.engine_io import Completion

__all__ = [
    "cancelled_before_engine",
    "dead_lettered_after_attempts",
    "engine_outcome",
    "finish_reason",
    "rejected_at_door",
    "undeliverable",
    "unrun_outcome",
]


def rejected_at_door(
    record: RecordRef,
    code: ErrorCode,
    message: str,
    *,
    request_id: str,
    reply_topic: str,
    content_type: str,
    worker: str,
    value: bytes | None,
    headers: Headers,
    trace: TraceContext,
    metadata: dict[str, str] | None = None,
    max_dead_letter_bytes: int = 1 << 20,
    request: Request | None = None,
    kind: RequestKind = "generate",
) -> Outcome:
    """The outcome of a record refused before it was queued; undecodable ones are dead-lettered.
    Its result is of the request's kind (`kind`, when the record could not be decoded).

    A dead letter keeps at most `max_dead_letter_bytes` of the value (a header then gives the
    original size), so one oversized record cannot block the DLQ producer.
    """
    error = ErrorInfo(code=code, message=cut(message, MAX_ERROR_MESSAGE_CHARS))
    stamp = Stamp(request_id, worker, record.source(), error=error, metadata=metadata or {})
    result = error_result(kind_of(request) if request is not None else kind, stamp)
    dead_letter = None
    if code in DEAD_LETTER_CODES:
        dead_letter = _dead_letter(
            record,
            code,
            message,
            value,
            headers,
            max_dead_letter_bytes,
            worker=worker,
            stage=_DOOR_STAGES.get(code, "TASK_PUT"),
        )
    return Outcome(
        record=record,
        result=result,
        reply_topic=reply_topic,
        content_type=content_type,
        trace=trace,
        dead_letter=dead_letter,
        request=request,
    )


def undeliverable(
    outcome: Outcome, code: ErrorCode, message: str, *, results_topic: str, value: bytes | None
) -> Outcome:
    """What is sent instead of a result that could not be delivered (too large for its topic,
    refused by the broker): an error result on the results topic, and a dead letter.

    `value`: the request as the dead letter keeps it (the original record stays on its topic).
    The error result keeps only the id, usage, model and source: it always fits.
    """
    old = outcome.result
    message = cut(message, MAX_ERROR_MESSAGE_CHARS)
    result = stripped(old, ErrorInfo(code=code, message=message))
    letter = outcome.dead_letter or _dead_letter(
        outcome.record, code, message, value, [], None, worker=old.worker, stage="KAFKA_PRODUCE"
    )
    return replace(outcome, result=result, reply_topic=results_topic, dead_letter=letter)


def dead_lettered_after_attempts(
    outcome: Outcome, value: bytes | None, attempts: Headers, *, max_dead_letter_bytes: int
) -> Outcome:
    """`outcome` (its request's last attempt failed for a transient reason) with its dead
    letter: the request as `value`, with the attempt headers `attempts` (every failed attempt
    in the history) before the headers saying why. Its error result is kept as it is."""
    error = outcome.result.error
    code = error.code if error is not None else ErrorCode.ENGINE_ERROR
    message = error.message if error is not None else ""
    letter = _dead_letter(outcome.record, code, message, value, attempts,
                          max_dead_letter_bytes, worker=outcome.result.worker,
                          stage="TASK_PUT")  # fmt: skip
    return replace(outcome, dead_letter=letter)


# The stage of Kafka Connect's pipeline (its `Stage` enum) where each refusal at the door
# would have happened: in a converter when the key or value cannot become a request, in
# KAFKA_CONSUME when the client could not read the record as sent, else in the task (a
# quarantined record killed the workers running it). A result that could not be delivered
# failed in KAFKA_PRODUCE.
_DOOR_STAGES = {
    ErrorCode.KEY_TOO_LARGE: "KEY_CONVERTER",
    ErrorCode.INVALID_ENCODING: "VALUE_CONVERTER",
    ErrorCode.INVALID_JSON: "VALUE_CONVERTER",
    ErrorCode.MESSAGE_TOO_LARGE: "VALUE_CONVERTER",
    ErrorCode.UNSUPPORTED_CONTENT_TYPE: "VALUE_CONVERTER",
    ErrorCode.SCHEMA_VIOLATION: "VALUE_CONVERTER",
    ErrorCode.MISSING_ID: "VALUE_CONVERTER",
    ErrorCode.ID_TOO_LONG: "VALUE_CONVERTER",
    ErrorCode.UNREADABLE_RECORD: "KAFKA_CONSUME",
}
_MAX_MESSAGE_BYTES = 1024  # a dead letter's error message, in each of its two headers


def _dead_letter(
    record: RecordRef,
    code: ErrorCode,
    message: str,
    value: bytes | None,
    headers: Headers,
    max_bytes: int | None,
    *,
    worker: str,
    stage: str,
) -> DeadLetter:
    """The record for the DLQ, bounded: at most `max_bytes` of the value, the key only if it is
    within the limit, the original headers only if they and ours stay within
    DEAD_LETTER_HEADER_BYTES (headers say what was cut).

    Ours follow the original headers and say why, and where the record was read, twice: in
    tokenmill's names and in Kafka Connect's (`messages.headers.CONNECT_*`). They are a few KB
    at most (the message and the worker id are cut), so a letter trimmed to them always fits.
    """
    kept = value if value is not None else b""  # Kafka refuses a null key and value
    truncated: list[tuple[str, bytes]] = []
    if max_bytes is not None and len(kept) > max_bytes:
        # The original stays on the source topic (see the source headers) until retention.
        kept = kept[:max_bytes]
        truncated.append((h.DLQ_TRUNCATED_FROM, str(len(value or b"")).encode()))
    key = record.key
    key_dropped: list[tuple[str, bytes]] = []
    if key is not None and len(key) > MAX_KEY_BYTES:
        key_dropped.append((h.DLQ_KEY_DROPPED, str(len(key)).encode()))
        key = None
    reason = _utf8(message, _MAX_MESSAGE_BYTES)
    topic = record.topic.encode()
    partition = str(record.partition).encode()
    offset = str(record.offset).encode()
    why = [
        (h.DLQ_ERROR_CODE, code.value.encode()),
        (h.DLQ_ERROR_MESSAGE, reason),
        (h.DLQ_SOURCE_TOPIC, topic),
        (h.DLQ_SOURCE_PARTITION, partition),
        (h.DLQ_SOURCE_OFFSET, offset),
        (h.CONNECT_TOPIC, topic),
        (h.CONNECT_PARTITION, partition),
        (h.CONNECT_OFFSET, offset),
        (h.CONNECT_CONNECTOR_NAME, h.CONNECT_CONNECTOR.encode()),
        (h.CONNECT_TASK_ID, _utf8(worker, MAX_NAME_CHARS)),
        (h.CONNECT_STAGE, stage.encode()),
        (h.CONNECT_EXCEPTION, h.connect_exception_class(code).encode()),
        (h.CONNECT_EXCEPTION_MESSAGE, reason),
    ]
    dropped: list[tuple[str, bytes]] = []
    if _header_bytes([*headers, *truncated, *key_dropped, *why]) > DEAD_LETTER_HEADER_BYTES:
        dropped.append((h.DLQ_HEADERS_DROPPED, str(len(headers)).encode()))
        headers = []
    return DeadLetter(
        key=key, value=kept, headers=[*headers, *truncated, *dropped, *key_dropped, *why]
    )


def _header_bytes(headers: Headers) -> int:
    """The bytes `headers` take in a record: each name and value, and their two lengths (varints
    of at most 3 bytes each below 1 MiB)."""
    return sum(len(k.encode(errors="replace")) + len(v) + 6 for k, v in headers)


def _utf8(text: str, max_bytes: int) -> bytes:
    """`text` as UTF-8, cut to at most `max_bytes` without splitting a character."""
    return text.encode(errors="replace")[:max_bytes].decode(errors="ignore").encode()


def engine_outcome(
    item: Admitted,
    completion: Completion,
    *,
    model: ModelRef,
    worker: str,
    queued_ms: float,
    error: ErrorInfo | None = None,
) -> Outcome:
    """The outcome of a request the engine ran (finished, or aborted there): its result is
    `completion`, the engine's one value for it, mapped whole (`completed_result`: text,
    tokens, finish reason, usage as the engine counted it, ttft/tpot, logprobs, choices,
    prompt logprobs and text; an embedding request's vectors).

    `model`: the model it ran on; `queued_ms`: consumed → admitted to the engine; `error`:
    why it was aborted, when it was. A request answered without a run has
    `unrun_outcome`.
    """
    timings = Timings(
        queued_ms=queued_ms,
        ttft_ms=completion.ttft_ms,
        tpot_ms=completion.tpot_ms,
        total_ms=(time.monotonic() - item.consumed_at) * 1000,
    )
    stamp = Stamp(item.request.id, worker, item.record.source(), model, timings, error,
                  item.request.metadata)  # fmt: skip
    truncated = item.embed.truncated if item.embed is not None else 0
    result = completed_result(item.request, completion, stamp, truncated=truncated)
    return _admitted_outcome(
        item, result, preemptions=completion.num_preemptions, kv_blocks=completion.num_kv_blocks
    )


def unrun_outcome(
    item: Admitted,
    reason: str,
    *,
    model: ModelRef,
    worker: str,
    error: ErrorInfo | None = None,
) -> Outcome:
    """The outcome of an admitted request answered without a run, so without a `Completion`:
    cancelled before the engine had it, refused by the engine, or failed with it. No tokens;
    its prompt tokens as the ingest counted them; queued until now."""
    queued_ms = (time.monotonic() - item.consumed_at) * 1000
    timings = Timings(queued_ms=queued_ms, total_ms=queued_ms)
    stamp = Stamp(item.request.id, worker, item.record.source(), model, timings, error,
                  item.request.metadata)  # fmt: skip
    result = error_result(
        kind_of(item.request), stamp, reason=reason, prompt_tokens=len(item.prompt_token_ids)
    )
    return _admitted_outcome(item, result)


def _admitted_outcome(
    item: Admitted, result: Result, *, preemptions: int = 0, kv_blocks: int = 0
) -> Outcome:
    return Outcome(
        record=item.record,
        result=result,
        reply_topic=item.reply_topic,
        content_type=item.content_type,
        trace=item.trace,
        cost_tokens=item.cost_tokens,
        admitted=True,
        batch_span=item.batch_span,
        request=item.request,
        attempts=item.attempts,
        preemptions=preemptions,
        kv_blocks=kv_blocks,
    )


def cancelled_before_engine(
    item: Admitted, *, model: ModelRef, worker: str, where: CancelledIn
) -> Outcome:
    """The outcome of a request cancelled before the engine had it (in a bucket or queued):
    `finish_reason` cancelled, no tokens, no error (an embedding request's result says
    `cancelled` in its error)."""
    outcome = unrun_outcome(item, "cancelled", model=model, worker=worker)
    outcome.cancelled_in = where
    return outcome
