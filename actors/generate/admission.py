"""Admission: a batch's requests into the active engine, each recorded as `InFlight`.

A request whose id already runs joins that run when it is a copy of it (`InFlight.is_copy`),
and is answered `duplicate_request` otherwise. A request tokenized for another model (queued
before a flip) is tokenized again for the active one. One the engine refuses, or that fails to
be added, is answered with the error: no item is ever lost.
"""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from collections.abc import Callable
from typing import Any, TypeGuard

import structlog

from actors.faults import Faults
from actors.generate.answers import Answers
from actors.in_flight import InFlight, engine_request
from actors.mail import Admitted, Batch
from actors.streaming.policy import StreamPolicy
from actors.streaming.token_stream import TokenStream
from actors.swap.model_slots import ModelSlots
from actors.telemetry.tracing import record_batch_span
from gpu.errors import RequestRejected
from messages.error_codes import ErrorCode
from messages.errors import InvalidRequest
from messages.request import GenerateRequest
from messages.request_kinds import Request
from messages.result import ErrorInfo

log = structlog.get_logger("tokenmill.gpu")


async def admit(
    batch: Batch,
    in_flight: dict[str, InFlight],
    *,
    slots: ModelSlots,
    answers: Answers,
    faults: Faults,
    streaming: StreamPolicy,
) -> None:
    """Add each of `batch`'s items to the active engine of `slots` and to `in_flight` (request
    id → its run), or join it to the run it copies, or answer it through `answers`."""
    now = time.monotonic()
    batch_span = record_batch_span(batch) if batch.reason != "requeued" else None
    for item in batch.items:
        if batch_span is not None:
            item.batch_span = batch_span
        request = item.request
        faults.on_admit(request.id)  # test-only; ends the process when asked to
        running = in_flight.get(request.id)
        if running is not None and running.is_copy(item):
            running.copies.append(item)
            continue
        if running is not None:
            await answers.error(item, duplicate_error(item, running))
            continue
        engine, tokens = _engine_for(slots, item)
        if engine is None:
            await answers.error(item, tokens)
            continue
        try:
            faults.adding(request.id, item.attempts.number)  # test-only; may raise
            runs = engine_request(item, tokens)
            if runs.params.constraint is not None:
                # Compiling a grammar can take a while (the first builds the library's view
                # of the vocabulary: seconds for a large one), so not on the event loop.
                await asyncio.to_thread(engine.prepare, runs)
            engine.add(runs)
        except RequestRejected as exc:
            await answers.error(item, ErrorInfo(code=exc.code, message=str(exc)))
            continue
        except Exception as exc:  # never lose an item: it is answered, the actor goes on
            log.exception("admit_failed", request_id=request.id)
            error = ErrorInfo(code=ErrorCode.ENGINE_ERROR, message=repr(exc))
            await answers.error(item, error)
            continue
        in_flight[request.id] = InFlight(
            item,
            engine,
            model=slots.front_of(engine).ref,
            admitted_at=now,
            requeued=batch.reason == "requeued",
            streams=_streams_for(streaming, request, engine, now) if _streamed(request) else [],
        )


def duplicate_error(item: Admitted, running: InFlight) -> ErrorInfo:
    """The error for `item`, which reuses the id of another request that runs now."""
    log.warning(
        "duplicate_request",
        request_id=item.request.id[:128],
        topic=item.record.topic,
        partition=item.record.partition,
        offset=item.record.offset,
        running_offset=running.item.record.offset,
    )
    message = (
        f"request {item.request.id[:128]!r} is already running on this worker as another "
        "request; use a new id (or send the same request, to the same reply topic, again)"
    )
    return ErrorInfo(code=ErrorCode.DUPLICATE_REQUEST, message=message)


def _engine_for(slots: ModelSlots, item: Admitted) -> tuple[Any, Any]:
    """The active engine and `item`'s tokens for it, or (None, the error to answer).

    An item tokenized for another model (queued before a flip) is tokenized again (a request
    of the task the new model does not serve is answered `unsupported_task`).
    """
    engine = slots.active
    if item.model_digest in ("", engine.model.digest):
        return engine, item.embed if item.embed is not None else item.prompt_token_ids
    try:
        return engine, slots.front.tokenize(item.request)
    except InvalidRequest as exc:
        return None, ErrorInfo(code=exc.code, message=str(exc))
    except Exception as exc:  # the new model's tokenizer or template failed on it
        return None, ErrorInfo(code=ErrorCode.INVALID_PROMPT, message=repr(exc))


def _streamed(request: Request) -> TypeGuard[GenerateRequest]:
    """A generation request that asked for chunks (an embedding request never does)."""
    return isinstance(request, GenerateRequest) and request.stream


def _streams_for(
    policy: StreamPolicy, request: GenerateRequest, engine: Any, now: float
) -> list[TokenStream]:
    """The chunk state of a streamed request's run, one per choice (a run again gets new
    ones). With logprobs asked, each token's text is decoded alone, special tokens included,
    as the result's logprobs show them."""
    tokens, interval_s, floor_s = policy.intervals(request)
    run = uuid.uuid4().hex[:16]
    tokenizer = engine.model.tokenizer
    token_text = _token_texts(tokenizer) if request.logprobs is not None else None
    return [
        TokenStream(
            request.id,
            run,
            functools.partial(
                tokenizer.decode,
                skip_special_tokens=request.skip_special_tokens,  # as the result's text
            ),
            stop=request.stop,
            interval_tokens=tokens,
            interval_s=interval_s,
            min_interval_s=floor_s,
            started=now,
            index=index,
            token_text=token_text,
        )
        for index in range(request.n)
    ]


def _token_texts(tokenizer: Any) -> Callable[[int], str]:
    def token_text(token: int) -> str:
        return str(tokenizer.decode([token], skip_special_tokens=False))

    return token_text
