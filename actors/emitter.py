"""EmitterActor: produces each `Outcome`'s result (and dead letter), then reports it delivered.

One idempotent producer (`acks=all`, `enable_idempotence`): a result is keyed by request id
and carries the request's trace headers, its content type and schema. Only after the broker
acknowledges every record of an outcome is `Delivered` sent to the ingest, which may then
commit the source offset. A send that keeps failing crashes the actor: the offset stays
uncommitted and the request is redelivered, so nothing is lost.

Mailbox: `Outcome`s from the ingest and the GPU actor. Sends: `Delivered` to the ingest.
`stop()`: produce what is queued, wait for every acknowledgement, close.
After a crash, a restarted `run()` first produces again what was never acknowledged.
"""

from __future__ import annotations

import asyncio
from typing import Any

import structlog
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from actors.config import WorkerConfig
from actors.mail import Delivered, Outcome
from actors.request_log import log_outcome
from actors.runtime import Actor
from actors.tracing import RequestSpans, start_request_spans
from messages import headers as h
from messages.codec import Codec
from messages.error_codes import ErrorCode
from messages.result import ErrorInfo, GenerateResult

log = structlog.get_logger("tokenmill.emitter")

_RESULT_SCHEMA = b"GenerateResult/1"


class EmitterActor(Actor[Outcome]):
    def __init__(self, config: WorkerConfig) -> None:
        super().__init__("emitter", mailbox_size=1024)
        self.config = config
        self.ingest: Actor[Any] | None = None  # takes `Delivered`  # wired by the worker (a cycle)
        self.codec = Codec(GenerateResult)
        self.results_sent = 0
        self.dead_letters_sent = 0
        self._window = asyncio.Semaphore(config.emit_max_in_flight)
        # Outcomes handed to the producer but not yet acknowledged: produced again when the
        # actor is restarted after a crash, so none is lost (their offsets are uncommitted).
        self._unconfirmed: dict[int, Outcome] = {}
        self.metrics: Any = None  # a WorkerMetrics, when the worker has one

    async def run(self) -> None:
        self._window = asyncio.Semaphore(self.config.emit_max_in_flight)
        backlog = list(self._unconfirmed.values())
        self._unconfirmed.clear()
        if backlog:
            log.warning("emitter_resending", outcomes=len(backlog))
        producer = AIOKafkaProducer(
            bootstrap_servers=self.config.bootstrap_servers,
            client_id=f"tokenmill-{self.config.worker_id}",
            acks="all",
            enable_idempotence=True,
            linger_ms=self.config.linger_ms,
            # Room for a dead letter of max_request_bytes plus its headers.
            max_request_size=self.config.max_request_bytes + (256 << 10),
        )
        await producer.start()
        try:
            async with asyncio.TaskGroup() as confirms:
                while True:
                    if backlog:
                        group, backlog = backlog, []
                    elif (first := await self.receive()) is not None:
                        group = [first, *self.drain_mailbox()]
                    else:
                        break
                    for outcome in group:  # before any await: a crash resends all of them
                        self._unconfirmed[id(outcome)] = outcome
                    sends = []
                    for outcome in group:
                        await self._window.acquire()
                        spans = start_request_spans(outcome, group=self.config.group)
                        sends.append((await self._produce(producer, outcome, spans), spans))
                    confirms.create_task(self._confirm(group, sends))
        finally:
            await producer.stop()
            log.info("emitter_stopped", results=self.results_sent, dlq=self.dead_letters_sent)

    async def _produce(
        self, producer: AIOKafkaProducer, outcome: Outcome, spans: RequestSpans
    ) -> list[asyncio.Future[object]]:
        """Queue the outcome's records in the producer; returns their ack futures."""
        headers = [
            *spans.headers,
            (h.CONTENT_TYPE, outcome.content_type.encode()),
            (h.SCHEMA, _RESULT_SCHEMA),
        ]
        key = outcome.result.id.encode() or outcome.record.key
        try:
            result_sent = await producer.send(
                outcome.reply_topic,
                value=self.codec.encode(outcome.result, outcome.content_type),
                key=key,
                headers=headers,
            )
        except KafkaError as exc:
            if outcome.reply_topic == self.config.results_topic:
                raise  # the worker's own topic is broken: crash, the offset stays uncommitted
            # The request's own reply_to cannot take it (unknown topic, too large, ...): the
            # result goes to the default topic, saying why, rather than crash on every restart.
            log.warning("reply_to_refused", topic=outcome.reply_topic, error=repr(exc))
            if outcome.result.error is None:
                outcome.result.error = ErrorInfo(
                    code=ErrorCode.INVALID_REPLY_TO,
                    message=f"cannot produce to reply_to {outcome.reply_topic!r}: {exc!r}",
                )
            result_sent = await producer.send(
                self.config.results_topic,
                value=self.codec.encode(outcome.result, outcome.content_type),
                key=key,
                headers=headers,
            )
        futures = [result_sent]
        letter = outcome.dead_letter
        if letter is not None:
            try:
                dead = await producer.send(
                    self.config.dlq_topic,
                    value=letter.value,
                    key=letter.key,
                    headers=letter.headers,
                )
            except KafkaError as exc:  # e.g. huge original headers: keep only ours
                log.warning("dead_letter_trimmed", error=repr(exc))
                ours = [(k, v) for k, v in letter.headers if k.startswith("tokenmill-")]
                dead = await producer.send(
                    self.config.dlq_topic, value=letter.value, key=letter.key, headers=ours
                )
            futures.append(dead)
        return futures

    async def _confirm(
        self,
        group: list[Outcome],
        sends: list[tuple[list[asyncio.Future[object]], RequestSpans]],
    ) -> None:
        try:
            for outcome, (futures, spans) in zip(group, sends, strict=True):
                try:
                    for future in futures:
                        await future  # raises when the broker refused it after retries
                except BaseException as exc:
                    spans.end(exc)
                    raise
                spans.end()
                log_outcome(
                    outcome,
                    spans.headers,
                    sample_rate=self.config.log_sample_rate,
                    payloads=self.config.log_payloads,
                )
                self.results_sent += 1
                if self.metrics is not None:
                    self.metrics.observe_outcome(outcome.result, admitted=outcome.admitted)
                self.dead_letters_sent += len(futures) - 1
                if self.ingest is not None:
                    await self.ingest.send(
                        Delivered(
                            record=outcome.record,
                            admitted=outcome.admitted,
                            cost_tokens=outcome.cost_tokens,
                        )
                    )
                self._unconfirmed.pop(id(outcome), None)
        finally:
            for _ in group:
                self._window.release()
