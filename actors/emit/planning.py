"""An outcome's records: its result, within the producer's limit, then its dead letter.

A result that cannot be delivered (too large for the producer, or refused by the broker for
good) is answered instead: an error result on the results topic, the request to the DLQ.
"""

from __future__ import annotations

from collections.abc import Callable

import structlog

from actors.config import WorkerConfig
from actors.emit.records import Pending, Record
from actors.results import undeliverable
from messages import headers as h
from messages.codec import Codec
from messages.error_codes import ErrorCode
from messages.limits import MAX_KEY_BYTES
from messages.request import GenerateRequest
from messages.result import GenerateResult

log = structlog.get_logger("tokenmill.emitter")

_RESULT_SCHEMA = h.RESULT_SCHEMA.encode()


class OutcomePlanner:
    """Turns an outcome into its records; `count(action)` is told of each answered instead."""

    def __init__(self, count: Callable[[str], None]) -> None:
        self.codec = Codec(GenerateResult)
        self.request_codec = Codec(GenerateRequest)
        self.count = count
        self.answered_instead = 0  # results that could not be delivered, answered with an error

    def plan(self, p: Pending, config: WorkerConfig) -> None:
        """`p.records`: the result, within the producer's limit (else answered instead with
        `result_too_large`), then the dead letter, if any."""
        outcome = p.outcome
        key = outcome.result.id.encode() or outcome.record.key
        if key is not None and len(key) > MAX_KEY_BYTES:
            key = None
        headers = [
            *p.spans.headers,
            (h.CONTENT_TYPE, outcome.content_type.encode()),
            (h.SCHEMA, _RESULT_SCHEMA),
        ]
        value = self.codec.encode(outcome.result, outcome.content_type)
        result = Record(outcome.reply_topic, value, key, headers, is_result=True)
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
            dead = Record(config.dlq_topic, letter.value or b"", letter.key, letter.headers, False)
            p.records.append(dead)

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
            value = self.request_codec.encode(outcome.request, outcome.content_type)
        p.outcome = undeliverable(
            outcome, code, message, results_topic=config.results_topic, value=value
        )
        p.answered = code
