"""The per-request log line and the context every request's log lines carry.

    with request_context(record, "job-17", headers):   # binds request_id, trace_id, span_id,
        log.info("request_rejected", code=...)        # topic, partition, offset (contextvars)

    log_outcome(outcome, result_headers, sample_rate=0.01, payloads=False)

`log_outcome` runs once a result is acknowledged: a sampled `request_done` (info) for a
result without error, and always a `request_failed` (warning) for an engine-side error
(refusals at the door are logged by the ingest as `request_rejected`). Prompt and output
text appear only with `payloads` on.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import structlog

from actors.mail import Outcome, RecordRef
from actors.result_shapes import finish_of
from messages import headers as h
from messages.embedding import EmbedRequest, EmbedResult
from messages.headers import Headers
from messages.result import GenerateResult

log = structlog.get_logger("tokenmill.requests")


def trace_ids(headers: Headers) -> tuple[str, str]:
    """(trace id, span id) from a W3C traceparent header; empty strings without one."""
    value = h.header(headers, h.TRACEPARENT)
    parts = value.decode("latin-1").split("-") if value else []
    if len(parts) == 4 and len(parts[1]) == 32 and len(parts[2]) == 16:
        return parts[1], parts[2]
    return "", ""


@contextmanager
def request_context(record: RecordRef, request_id: str, headers: Headers) -> Iterator[None]:
    with bound_request(record, request_id, trace_ids(headers)):
        yield


@contextmanager
def bound_request(record: RecordRef, request_id: str, ids: tuple[str, str]) -> Iterator[None]:
    """`request_context` for a request whose (trace id, span id) were read already."""
    trace_id, span_id = ids
    with structlog.contextvars.bound_contextvars(
        request_id=request_id,
        trace_id=trace_id,
        span_id=span_id,
        topic=record.topic,
        partition=record.partition,
        offset=record.offset,
    ):
        yield


def log_outcome(
    outcome: Outcome,
    headers: Headers,
    *,
    sample_rate: float,
    payloads: bool,
    draw: Callable[[], float] = random.random,
) -> None:
    result = outcome.result
    failed = result.error is not None and outcome.admitted
    if result.error is not None and not failed:
        return  # refused at the door: the ingest logged it
    if not failed and draw() >= sample_rate:
        return
    fields: dict[str, Any] = {
        "finish_reason": str(finish_of(result)),
        "prompt_tokens": result.usage.prompt_tokens,
        "total_ms": round(result.timings.total_ms, 3),
    }
    if isinstance(result, EmbedResult):
        fields["embeddings"] = len(result.data)
    else:
        fields["completion_tokens"] = result.usage.completion_tokens
        fields["ttft_ms"] = result.timings.ttft_ms
    if payloads:
        fields |= _payloads(outcome)
    with request_context(outcome.record, result.id, headers):
        if result.error is not None:
            log.warning(
                "request_failed", code=str(result.error.code), message=result.error.message,
                **fields,
            )  # fmt: skip
        else:
            log.info("request_done", **fields)


def _payloads(outcome: Outcome) -> dict[str, Any]:
    """What the request asked and (for generation) the text it got; never vectors."""
    request, result = outcome.request, outcome.result
    if isinstance(request, EmbedRequest):
        return {"input": request.input}
    prompt: Any = None
    if request is not None:
        if request.prompt is not None:
            prompt = request.prompt
        elif request.messages is not None:
            prompt = [{"role": m.role, "content": m.content} for m in request.messages]
        else:
            prompt = request.prompt_token_ids
    return {"prompt": prompt, "text": result.text if isinstance(result, GenerateResult) else ""}
