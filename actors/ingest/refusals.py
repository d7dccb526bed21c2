"""Refusals: how the ingest answers a record it will not run, without the engine.

An undecodable record, a request that breaks a rule, one whose deadline passed, a quarantined
record, one whose admission failed on a bug: each gets one `Outcome` (an error result, plus a
dead letter when it cannot be read as a request) sent straight to the emitter, so its offset
is committed like any other. What the record's headers say comes from its `Envelope`.
"""

from __future__ import annotations

import structlog

from actors.config import WorkerConfig
from actors.ingest.envelope import Envelope
from actors.ingest.reply_topics import ReplyTopics
from actors.ingest.rules import key_text
from actors.mail import Outcome
from actors.results import rejected_at_door
from actors.runtime import Address
from actors.telemetry.request_log import bound_request
from messages import headers as h
from messages.attempts import Attempts, failed_attempt, without_attempt_headers
from messages.error_codes import ErrorCode
from messages.errors import InvalidRequest, UndecodableRequest
from messages.headers import Headers
from messages.request_decoding import decode_request
from messages.request_kinds import Request, RequestKind, kind_of

log = structlog.get_logger("tokenmill.ingest")


class Refusals:
    def __init__(
        self, config: WorkerConfig, reply_topics: ReplyTopics, outcomes: Address[Outcome]
    ) -> None:
        """`outcomes`: the emitter's mailbox."""
        self.config = config
        self.reply_topics = reply_topics
        self.outcomes = outcomes

    async def reject(
        self,
        envelope: Envelope,
        exc: UndecodableRequest | InvalidRequest,
        value: bytes | None,
        request: Request | None = None,
        *,
        headers: Headers | None = None,
        kind: RequestKind | None = None,
    ) -> None:
        """Answer a record that cannot run: an error result (to its `reply_to` when that is
        usable) and, when it is undecodable, its dead letter (with `headers`, by default the
        record's own). The result is of the request's kind (`kind`, when it could not be
        decoded; by default a `GenerateResult`)."""
        ref = envelope.record
        if request is not None:
            kind = kind_of(request)
        if isinstance(exc, UndecodableRequest):
            request_id = exc.request_id or key_text(ref.key)
            reply_to = exc.reply_to
        else:
            request_id = request.id if request else ""
            reply_to = request.reply_to if request else None
        if not (reply_to and await self.reply_topics.usable(reply_to)):
            reply_to = self.config.results_topic
        with bound_request(ref, request_id, envelope.trace_ids):
            log.info("request_rejected", code=exc.code.value)
        outcome = rejected_at_door(
            ref,
            exc.code,
            exc.message,
            request_id=request_id,
            reply_topic=reply_to,
            content_type=envelope.reply_content_type,
            worker=self.config.worker_id,
            value=value,
            headers=envelope.headers if headers is None else headers,
            trace=envelope.trace,
            metadata=request.metadata if request else None,
            max_dead_letter_bytes=self.config.max_request_bytes,
            request=request,
            kind=kind or "generate",
        )
        await self.outcomes.send(outcome)

    async def unreadable(self, envelope: Envelope, value: bytes | None, reason: str) -> None:
        """Answer a record the Kafka client could not read as sent (`record_reader`): a
        header key that is not UTF-8, a corrupt batch. Not run; its bytes to the DLQ."""
        ref = envelope.record
        log.warning("record_unreadable", topic=ref.topic, partition=ref.partition,
                    offset=ref.offset, reason=reason)  # fmt: skip
        request = self._salvage(envelope, value)
        error = UndecodableRequest(
            ErrorCode.UNREADABLE_RECORD,
            f"the record cannot be read as sent: {reason} (the record is on the DLQ)",
            request_id=request.id if request is not None else "",
            reply_to=request.reply_to if request is not None else None,
        )
        await self.reject(envelope, error, value, kind=envelope.kind(value))

    def _salvage(self, envelope: Envelope, value: bytes | None) -> Request | None:
        """The request in `value`, for its id and reply_to, if it is one."""
        try:
            return decode_request(
                value,
                envelope.raw_content_type,
                max_bytes=self.config.max_request_bytes,
                kind=envelope.kind(value),
            )
        except UndecodableRequest:
            return None

    async def quarantine(self, envelope: Envelope, value: bytes | None, deaths: int) -> None:
        """Answer a record that was in flight when `deaths` workers died, without running it.
        Each death was an attempt: its dead letter's attempt headers name them after the
        failed attempts its record came with."""
        ref = envelope.record
        log.error("record_quarantined", topic=ref.topic, partition=ref.partition,
                  offset=ref.offset, deaths=deaths)  # fmt: skip
        request = self._salvage(envelope, value)  # its id and reply_to, if it has them
        error = UndecodableRequest(
            ErrorCode.QUARANTINED,
            f"quarantined: {deaths} workers died while this record was the oldest one running "
            "on its partition; it is not run again (the record is on the DLQ)",
            request_id=request.id if request is not None else "",
            reply_to=request.reply_to if request is not None else None,
        )
        crashes = (h.DLQ_CRASHES, str(deaths).encode())
        own = without_attempt_headers(envelope.headers)
        attempts = attempts_after_deaths(envelope.attempts, deaths).headers()
        await self.reject(envelope, error, value, headers=[*own, crashes, *attempts],
                          kind=envelope.kind(value))  # fmt: skip

    async def internal_error(
        self, envelope: Envelope, exc: Exception, kind: RequestKind = "generate"
    ) -> None:
        """Answer a record whose admission failed unexpectedly (`internal_error`) with a result
        of its `kind`; the ingest goes on with the next one."""
        ref = envelope.record
        log.exception("record_internal_error", topic=ref.topic, partition=ref.partition,
                      offset=ref.offset)  # fmt: skip
        error = InvalidRequest(
            ErrorCode.INTERNAL_ERROR,
            f"the worker failed admitting this record ({type(exc).__name__}); it was not run",
        )
        await self.reject(envelope, error, None, kind=kind)


def attempts_after_deaths(attempts: Attempts, deaths: int) -> Attempts:
    """`attempts` (a record's own) followed by `deaths` attempts that each killed a worker:
    the last attempt made, and every failure in the history."""
    history = list(attempts.history)
    for n in range(attempts.number, attempts.number + deaths):
        history.append(failed_attempt(n, worker="", code="worker_died",
                                      message="a worker died while running it"))  # fmt: skip
    return Attempts(attempts.number + max(deaths, 1) - 1, tuple(history))
