"""An outcome's records: its result, within the producer's limit, then its dead letter; or,
for a request to try again, only the request for its retry topic.

A result that cannot be delivered (too large for the producer, or refused by the broker for
good) is answered instead: an error result on the results topic, the request to the DLQ.

A request that failed for a transient reason (`actors.emit.retries`) before its last attempt
is not answered: its outcome's one record is the request, for `<requests topic>.retry.<N>`,
with its next attempt's headers (`messages.attempts`). It rides the result's path (the same
acknowledgements, the same transaction with `--exactly-once`), and the ingest reads it again
once its backoff has passed. After the last attempt the outcome is its error result and the
request's dead letter, the history in its headers. A retry record the broker refuses for good
is dead-lettered the same way (`retry_refused`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import structlog

from actors.config import WorkerConfig, retry_topic
from actors.emit.records import Pending, Record
from actors.emit.retries import Step, backoff_ms, next_step
from actors.results import dead_lettered_after_attempts, undeliverable
from messages import headers as h
from messages.attempts import Attempts, failed_attempt
from messages.codec import encode
from messages.embedding import EmbedRequest
from messages.error_codes import ErrorCode
from messages.limits import MAX_KEY_BYTES
from messages.request_kinds import RESULT_SCHEMAS

if TYPE_CHECKING:
    from actors.mail import Outcome

log = structlog.get_logger("tokenmill.emitter")

_RESULT_SCHEMAS = {kind: schema.encode() for kind, schema in RESULT_SCHEMAS.items()}
_EMBED_REQUEST_SCHEMA = h.EMBED_REQUEST_SCHEMA.encode()


class OutcomePlanner:
    """Turns an outcome into its records; `count(action)` is told of each answered instead.

    `retries_usable`: the retry topics were found (the emitter checks them at start); until
    then a transient failure is dead-lettered at once."""

    def __init__(self, count: Callable[[str], None], *, retries_usable: bool = False) -> None:
        self.count = count
        self.answered_instead = 0  # results that could not be delivered, answered with an error
        self.retries_usable = retries_usable

    def plan(self, p: Pending, config: WorkerConfig) -> None:
        """`p.records`: the request for its retry topic, when it is to be tried again; else
        the result, within the producer's limit (else answered instead with
        `result_too_large`), then the dead letter, if any."""
        outcome = p.outcome
        step = self.step(p, config)
        if step is Step.RETRY:
            p.records = [self._retry(p, config)]
            return
        if step is Step.DEAD_LETTER and outcome.dead_letter is None:
            p.outcome = outcome = self._exhausted(p, config)
        key = outcome.result.id.encode() or outcome.record.key
        if key is not None and len(key) > MAX_KEY_BYTES:
            key = None
        headers = [
            *p.spans.headers,
            (h.CONTENT_TYPE, outcome.content_type.encode()),
            (h.SCHEMA, _RESULT_SCHEMAS[type(outcome.result)]),
        ]
        if outcome.attempts.number > 1:  # which attempt answered it
            headers.append((h.ATTEMPT, str(outcome.attempts.number).encode()))
        value = encode(outcome.result, outcome.content_type)
        result = Record(outcome.reply_topic, value, key, headers, "result")
        if result.size > config.producer_max_bytes and p.answered is None:
            message = (
                f"the result is {result.size} bytes; this worker sends at most "
                f"{config.producer_max_bytes}"
            )
            self.answer_instead(p, ErrorCode.RESULT_TOO_LARGE, message, config)
            return self.plan(p, config)
        p.records = [result]
        letter = outcome.dead_letter
        if letter is not None:
            dead = Record(config.dlq_topic, letter.value or b"", letter.key, letter.headers,
                          "dead_letter")  # fmt: skip
            p.records.append(dead)

    def step(self, p: Pending, config: WorkerConfig) -> Step:
        """Whether `p`'s request is answered, retried or dead-lettered after this attempt."""
        outcome = p.outcome
        error = outcome.result.error
        if error is None or not outcome.admitted or outcome.request is None:
            return Step.ANSWER
        usable = self.retries_usable and not p.no_retry
        return next_step(error.code, outcome.attempts.number, config.max_attempts,
                         retries_usable=usable)  # fmt: skip

    def retry_refused(self, p: Pending, failure: BaseException, config: WorkerConfig) -> None:
        """`p`'s retry record was refused for good (its topic gone, say): its request is
        dead-lettered with its error result instead (`p.records` is planned again here)."""
        topic = p.records[0].topic if p.records else ""
        log.warning("retry_refused", request_id=p.outcome.result.id[:128], topic=topic,
                    error=repr(failure)[:512])  # fmt: skip
        self.count("retry_refused")
        p.no_retry = True
        self.plan(p, config)

    def _next_attempt(self, p: Pending) -> Attempts:
        """The attempts after this one failed: its history names this one too."""
        outcome = p.outcome
        error = outcome.result.error
        assert error is not None
        entry = failed_attempt(outcome.attempts.number, worker=outcome.result.worker,
                               code=error.code.value, message=error.message)  # fmt: skip
        return outcome.attempts.failed(entry)

    def _retry(self, p: Pending, config: WorkerConfig) -> Record:
        """The request again, for the retry topic of its next attempt, due after its backoff."""
        outcome = p.outcome
        assert outcome.request is not None
        following = self._next_attempt(p)
        failed = outcome.attempts.number
        due = int(time.time() * 1000) + backoff_ms(config.retry_backoff_ms, failed)
        following = Attempts(following.number, following.history, due)
        headers = [
            *p.spans.headers,
            (h.CONTENT_TYPE, outcome.content_type.encode()),
            *following.headers(),
        ]
        if isinstance(outcome.request, EmbedRequest):  # the body says so too; the header first
            headers.append((h.SCHEMA, _EMBED_REQUEST_SCHEMA))
        value = encode(outcome.request, outcome.content_type)
        key = outcome.record.key
        if key is None or len(key) > MAX_KEY_BYTES:
            key = outcome.request.id.encode() or None
        topic = retry_topic(config.requests_topic, failed)
        return Record(topic, value, key, headers, "retry")

    def _exhausted(self, p: Pending, config: WorkerConfig) -> Outcome:
        """`p`'s outcome with the dead letter of a request whose last attempt failed."""
        outcome = p.outcome
        assert outcome.request is not None
        value = encode(outcome.request, outcome.content_type)
        done = self._next_attempt(p)
        # On the letter: the attempts made (the last one's number) and every failure.
        attempts = Attempts(outcome.attempts.number, done.history).headers()
        code = outcome.result.error.code.value if outcome.result.error else ""
        log.warning("request_dead_lettered", request_id=outcome.result.id[:128],
                    attempts=outcome.attempts.number, code=code)  # fmt: skip
        return dead_lettered_after_attempts(
            outcome, value, attempts, max_dead_letter_bytes=config.max_request_bytes
        )

    def answer_instead(
        self, p: Pending, code: ErrorCode, message: str, config: WorkerConfig
    ) -> None:
        """Replace `p`'s result, which cannot be delivered, by an error result and a dead letter
        (`p.records` is planned again by the caller)."""
        outcome = p.outcome
        log.warning(
            "result_answered_instead",
            request_id=outcome.result.id[:128],
            topic=outcome.reply_topic,
            code=code.value,
            error=message[:512],
        )
        self.answered_instead += 1
        self.count("answered")
        value = None
        if outcome.request is not None:
            value = encode(outcome.request, outcome.content_type)
        p.outcome = undeliverable(
            outcome, code, message, results_topic=config.results_topic, value=value
        )
        p.answered = code
