"""EmitterActor: produces each `Outcome`'s result (and dead letter), then reports it delivered.

One idempotent producer (`acks=all`, `enable_idempotence`): a result is keyed by request id
and carries the request's trace headers, its content type and schema. Only after the broker
acknowledges every record of an outcome is `Delivered` sent to the ingest, which may then
commit the source offset.

No record and no failed send crashes it (see `actors.send_errors`):
- a record the broker refuses for good (too large for its topic or for the producer, a topic
  it may not write, one that is gone) is answered instead: an error result (`result_too_large`,
  `reply_to_refused`) on the results topic, the request to the DLQ with the reason;
- a dead letter is never dropped: one the DLQ refuses is trimmed to tokenmill's headers, and
  one refused even so is sent again every few seconds (`dead_letter_blocked`) until the DLQ
  takes it. Until then its outcome is not reported delivered, so its partition's commits stop
  there (other outcomes go on; a blocked one keeps its place in the in-flight window, so a DLQ
  that refuses everything stops the emitter once the window is full, never its memory). The
  ingest is told (`OutcomeBlocked`), so that a drain does not wait for it. A `stop()` gives a
  blocked one up, undelivered: its record is read again after a restart;
- a send that fails because the broker is away is sent again, with backoff, for as long as
  it takes; the outcomes behind it wait in the mailbox (the ingest's backpressure pauses
  fetching), none is lost; starting the producer waits for the broker the same way.
Only a producer that is itself broken crashes the actor; the restarted `run()` first produces
again what was never acknowledged (its offsets are uncommitted, so nothing is lost either way).

Streamed requests' `StreamChunk`s are produced as they come, on the result's topic and key
(so they precede it on its partition), with the schema header `GenerateChunk/1`. They mark
no offset done: an outcome is reported delivered only once its chunks are acknowledged too
(a chunk the broker refuses for good is dropped, logged; its result still says everything).
Chunks not acknowledged when the producer is replaced are sent again, before the backlog.

At its first start it checks that the DLQ topic exists and that this worker may write it
(`actors.kafka.preflight.topic_check`); if not, it raises `KafkaUnusable` and the worker
stops with that reason (a worker that cannot write a dead letter would stall its commits).

Mailbox: `Outcome`s from the ingest and the GPU actor, `StreamChunk`s from the GPU actor.
Sends: `Delivered` to the ingest; `OutcomeBlocked` first when a dead letter blocks one.
`stop()`: produce what is queued, wait for every acknowledgement (blocked dead letters are
given up, undelivered), close.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass

import structlog
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from actors.config import WorkerConfig
from actors.kafka.broker_wait import started
from actors.kafka.errors import KafkaUnusable
from actors.kafka.preflight import topic_check
from actors.mail import Delivered, Outcome, OutcomeBlocked, RecordRef, StreamChunk
from actors.results import undeliverable
from actors.runtime import Actor, Address, Mailbox
from actors.send_errors import (
    DeadLetterBlocked,
    ProducerBroken,
    UndeliveredResult,
    Verdict,
    backoff_s,
    refusal_code,
    verdict,
)
from actors.telemetry.metrics import WorkerMetrics
from actors.telemetry.request_log import log_outcome
from actors.telemetry.tracing import RequestSpans, start_request_spans
from messages import headers as h
from messages.chunk import GenerateChunk
from messages.codec import Codec
from messages.error_codes import ErrorCode
from messages.headers import Headers
from messages.limits import MAX_KEY_BYTES
from messages.request import GenerateRequest
from messages.result import GenerateResult

log = structlog.get_logger("tokenmill.emitter")

_RESULT_SCHEMA = h.RESULT_SCHEMA.encode()
_CHUNK_SCHEMA = h.CHUNK_SCHEMA.encode()


@dataclass(frozen=True, slots=True)
class _Record:
    topic: str
    value: bytes
    key: bytes | None
    headers: Headers
    is_result: bool  # False: the outcome's dead letter

    @property
    def size(self) -> int:
        """Bytes as the producer counts them against its `max_request_size`."""
        return int(
            DefaultRecordBatchBuilder.estimate_size_in_bytes(self.key, self.value, self.headers)
        )


@dataclass(slots=True)
class _SentChunk:
    """A chunk handed to the producer, kept until its request's outcome is delivered."""

    record: _Record
    ack: asyncio.Future[object] | None = None  # None: not sent yet (by this producer)
    confirmed: bool = False  # acknowledged (and counted)


@dataclass(slots=True)
class _Pending:
    """One outcome on its way: its records and their acknowledgements, in the same order."""

    outcome: Outcome
    spans: RequestSpans
    records: list[_Record]
    acks: list[asyncio.Future[object]]
    answered: ErrorCode | None = None  # set when its result was replaced by an error result
    key: int = 0  # its key among the unconfirmed: the outcome as received (`outcome` may change)
    chunks: list[_SentChunk] = dataclasses.field(default_factory=list)  # its request's
    blocked: int | None = None  # the index of its dead letter, refused even trimmed
    refusal: BaseException | None = None  # why it was refused, when blocked


class EmitterActor(Actor[Outcome | StreamChunk]):
    MAILBOX_SIZE = 1024
    BLOCKED_RETRY_S = 5.0  # the longest wait between two sends of a blocked dead letter

    def __init__(
        self,
        config: WorkerConfig,
        mailbox: Mailbox[Outcome | StreamChunk] | None = None,
        *,
        delivered: Address[Delivered | OutcomeBlocked] | None = None,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        """`delivered`: the ingest's mailbox, told of each acknowledged outcome and of each
        blocked one (None: no one)."""
        super().__init__("emitter", mailbox or Mailbox(self.MAILBOX_SIZE))
        self.config = config
        self.delivered = delivered
        self.codec = Codec(GenerateResult)
        self.request_codec = Codec(GenerateRequest)
        self.chunk_codec = Codec(GenerateChunk)
        self.results_sent = 0
        self.dead_letters_sent = 0
        self.answered_instead = 0  # results that could not be delivered, answered with an error
        self.chunks_sent = 0  # streamed requests' chunks, acknowledged
        # Chunks by request id, from their production until their request's outcome is
        # delivered (its offset may then be committed): sent again by a replaced producer.
        self._chunks: dict[str, list[_SentChunk]] = {}
        self._window = asyncio.Semaphore(config.emit_max_in_flight)
        # Outcomes handed to the producer but not yet acknowledged: produced again when the
        # actor is restarted after a crash, so none is lost (their offsets are uncommitted).
        self._unconfirmed: dict[int, Outcome] = {}
        self.metrics = metrics
        self.blocked_retry_s = self.BLOCKED_RETRY_S
        # Dead letters refused even trimmed, by outcome key: the source record each holds back.
        self.blocked: dict[int, RecordRef] = {}
        self.dead_letters_abandoned = 0  # blocked ones given up at stop (left uncommitted)
        self._dlq_checked = False

    async def run(self) -> None:
        attempt = 0
        while True:
            try:
                await self._serve()
                return
            except* ProducerBroken as broken:
                delay = backoff_s(attempt)
                attempt += 1
                self._count("replaced_producer")
                log.warning("producer_replaced", error=str(broken.exceptions[0]), retry_in_s=delay)
                await asyncio.sleep(delay)

    async def _serve(self) -> None:
        """One producer's life; raises `ProducerBroken` when it must be replaced."""
        self._window = asyncio.Semaphore(self.config.emit_max_in_flight)
        backlog = list(self._unconfirmed.values())
        if backlog:
            log.warning("emitter_resending", outcomes=len(backlog))
        producer = await started(
            self._new_producer, name="emitter", stopping=self.stopping, settings=self.config
        )
        if producer is None:
            return  # stopped before the broker came back: the backlog's offsets stay open
        try:
            await self._check_dead_letter_topic()
            self._unconfirmed.clear()
            for sent in [c for chunks in self._chunks.values() for c in chunks]:
                if not sent.confirmed and (sent.ack is None or not _acknowledged(sent.ack)):
                    sent.ack = await self._send(producer, sent.record)
            async with asyncio.TaskGroup() as confirms:
                while True:
                    messages: list[Outcome | StreamChunk]
                    if backlog:
                        messages, backlog = list(backlog), []
                    elif (first := await self.receive()) is not None:
                        messages = [first, *self.drain_mailbox()]
                    else:
                        break
                    group: list[Outcome] = []
                    chunks: list[_SentChunk] = []
                    for message in messages:  # before any await: a crash resends all of them
                        if isinstance(message, StreamChunk):
                            chunks.append(self._chunk_record(message))
                        else:
                            self._unconfirmed[id(message)] = message
                            group.append(message)
                    for sent in chunks:  # before any outcome: a request's precede its result
                        sent.ack = await self._send(producer, sent.record)
                    pending = []
                    for outcome in group:
                        await self._window.acquire()
                        spans = start_request_spans(outcome, group=self.config.group)
                        pending.append(await self._produce(producer, outcome, spans))
                    confirms.create_task(self._confirm(producer, pending, confirms))
        finally:
            await producer.stop()
            log.info(
                "emitter_stopped",
                results=self.results_sent,
                dlq=self.dead_letters_sent,
                answered_instead=self.answered_instead,
            )

    async def _check_dead_letter_topic(self) -> None:
        """Once, at the first start: `KafkaUnusable` unless the DLQ topic exists and this
        worker may write it. A broker that does not answer the question is asked again at
        the producer's next start (the sends wait for it meanwhile)."""
        if self._dlq_checked:
            return
        topic = self.config.dlq_topic
        check = await topic_check(self.config.kafka, topic)
        if not check.answered:
            log.warning("dlq_unchecked", topic=topic, reason=check.reason)
            return
        self._dlq_checked = True
        if not check.writable:
            log.error("dlq_unusable", topic=topic, reason=check.reason)
            raise KafkaUnusable(
                f"dead-letter topic: {check.reason}; create it (tokenmill topics create) or "
                "let this worker write it: a dead letter it cannot write stops its partition's "
                "commits"
            )
        log.info("dlq_checked", topic=topic)

    def _chunk_record(self, message: StreamChunk) -> _SentChunk:
        """`message` as a record on its result's topic and key, kept until its outcome is in."""
        chunk = message.chunk
        key = chunk.id.encode()
        headers = [
            *h.trace_headers(message.trace),
            (h.CONTENT_TYPE, message.content_type.encode()),
            (h.SCHEMA, _CHUNK_SCHEMA),
        ]
        value = self.chunk_codec.encode(chunk, message.content_type)
        record = _Record(message.reply_topic, value, key, headers, is_result=False)
        sent = _SentChunk(record)
        self._chunks.setdefault(chunk.id, []).append(sent)
        return sent

    def _new_producer(self) -> AIOKafkaProducer:
        return AIOKafkaProducer(
            **self.config.kafka.producer_kwargs(),
            client_id=f"tokenmill-{self.config.worker_id}",
            acks="all",
            enable_idempotence=True,
            linger_ms=self.config.linger_ms,
            max_request_size=self.config.producer_max_bytes,
            request_timeout_ms=self.config.delivery_timeout_ms,
        )

    # -- one outcome: its records, their acknowledgements, what replaces a refused one ----

    def _plan(self, p: _Pending) -> None:
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
        result = _Record(outcome.reply_topic, value, key, headers, is_result=True)
        if result.size > self.config.producer_max_bytes and p.answered is None:
            message = (
                f"the result is {result.size} bytes; this worker sends at most "
                f"{self.config.producer_max_bytes}"
            )
            self._answer_instead(p, ErrorCode.RESULT_TOO_LARGE, message)
            return self._plan(p)
        p.records = [result]
        letter = outcome.dead_letter
        if letter is not None:
            dead = _Record(
                self.config.dlq_topic, letter.value or b"", letter.key, letter.headers, False
            )
            p.records.append(dead)

    def _answer_instead(self, p: _Pending, code: ErrorCode, message: str) -> None:
        """Replace `p`'s result, which cannot be delivered, by an error result and a dead letter."""
        outcome = p.outcome
        log.warning(
            "result_answered_instead",
            request_id=outcome.result.id[:128],
            topic=outcome.reply_topic,
            code=code.value,
            error=message[:512],
        )
        self.answered_instead += 1
        self._count("answered")
        value = None
        if outcome.request is not None:
            value = self.request_codec.encode(outcome.request, outcome.content_type)
        p.outcome = undeliverable(
            outcome, code, message, results_topic=self.config.results_topic, value=value
        )
        p.answered = code

    async def _produce(
        self, producer: AIOKafkaProducer, outcome: Outcome, spans: RequestSpans
    ) -> _Pending:
        """Queue the outcome's records in the producer."""
        p = _Pending(outcome, spans, [], [], key=id(outcome))
        # Its request's chunks: those for its reply topic (another request under the same id,
        # answered `duplicate_request` elsewhere, has none of them).
        kept = self._chunks.get(outcome.result.id, ())
        p.chunks = [sent for sent in kept if sent.record.topic == outcome.reply_topic]
        if p.chunks and p.spans.records:  # on its `process` span
            p.spans.records[0].attributes["tokenmill.stream_chunks"] = len(p.chunks)
        self._plan(p)
        p.acks = [await self._send(producer, record) for record in p.records]
        return p

    async def _send(self, producer: AIOKafkaProducer, record: _Record) -> asyncio.Future[object]:
        """The acknowledgement of `record`; a failure to queue it comes back as a failed one."""
        try:
            ack: asyncio.Future[object] = await producer.send(
                record.topic, value=record.value, key=record.key, headers=list(record.headers)
            )
            # Its failure is read by `_settle`, unless the producer is replaced first.
            ack.add_done_callback(_retrieve)
            return ack
        except KafkaError as exc:
            failed: asyncio.Future[object] = asyncio.get_running_loop().create_future()
            failed.set_exception(exc)
            return failed

    async def _confirm(
        self, producer: AIOKafkaProducer, pending: list[_Pending], tasks: asyncio.TaskGroup
    ) -> None:
        """Report each of `pending` delivered once settled, in order; one whose dead letter is
        blocked is handed to a task of its own (`_unblock`), with its place in the window."""
        handed_on = 0
        try:
            for p in pending:
                try:
                    settled = await self._settle(producer, p)
                except BaseException as exc:
                    p.spans.end(exc)
                    raise
                if settled:
                    await self._report(p)
                else:
                    tasks.create_task(self._unblock(producer, p))
                    handed_on += 1
        finally:
            for _ in range(len(pending) - handed_on):
                self._window.release()

    async def _report(self, p: _Pending) -> None:
        """`p` is acknowledged: tell the ingest, which may commit its offset."""
        self._delivered(p)
        self._forget_chunks(p)
        if self.delivered is not None:
            await self.delivered.send(
                Delivered(
                    record=p.outcome.record,
                    admitted=p.outcome.admitted,
                    cost_tokens=p.outcome.cost_tokens,
                )
            )
        self._unconfirmed.pop(p.key, None)

    def _forget_chunks(self, p: _Pending) -> None:
        """Drop the chunks `p` waited for (only those: another request's under the same id,
        one refused as a duplicate while this one streams, stay kept)."""
        request_id = p.outcome.result.id
        kept = self._chunks.get(request_id)
        if kept is None:
            return
        mine = {id(sent) for sent in p.chunks}
        if left := [sent for sent in kept if id(sent) not in mine]:
            self._chunks[request_id] = left
        else:
            del self._chunks[request_id]

    async def _unblock(self, producer: AIOKafkaProducer, p: _Pending) -> None:
        """Tell the ingest `p` is blocked, send its dead letter again every few seconds until
        the DLQ takes it, then report `p` delivered. Given up at `stop()`: never reported, so
        its offset is never committed (its record is read again: at-least-once). Holds `p`'s
        place in the window until then."""
        source = p.outcome.record
        self.blocked[p.key] = source
        attempt, cap = 0, self.blocked_retry_s
        try:
            if self.delivered is not None:
                await self.delivered.send(OutcomeBlocked(source))
            while p.blocked is not None:
                record = p.records[p.blocked]
                delay = backoff_s(attempt, first_s=min(1.0, cap), cap_s=cap)
                attempt += 1
                self._count("dead_letter_blocked")
                log.error(
                    "dead_letter_blocked",
                    topic=source.topic,
                    partition=source.partition,
                    offset=source.offset,
                    dlq=record.topic,
                    error=repr(p.refusal),
                    attempts=attempt,
                    retry_in_s=round(delay, 2),
                )
                if await self._stopped_within(delay):
                    self.dead_letters_abandoned += 1
                    log.warning("dead_letter_abandoned", topic=source.topic,
                                partition=source.partition, offset=source.offset,
                                detail="left uncommitted: read again after a restart")  # fmt: skip
                    p.spans.end(DeadLetterBlocked(record.topic))
                    return
                p.acks[p.blocked] = await self._send(producer, record)
                p.blocked = None
                try:
                    await self._settle(producer, p)  # sets `p.blocked` again if refused
                except BaseException as exc:
                    p.spans.end(exc)
                    raise
            log.info("dead_letter_unblocked", topic=source.topic, partition=source.partition,
                     offset=source.offset, attempts=attempt)  # fmt: skip
            await self._report(p)
        finally:
            self.blocked.pop(p.key, None)
            self._window.release()

    async def _stopped_within(self, delay_s: float) -> bool:
        """Wait `delay_s`, or less if the actor is stopped meanwhile: True then."""
        try:
            await asyncio.wait_for(self.stopping.wait(), delay_s)
        except TimeoutError:
            return False
        return True

    async def _settle(self, producer: AIOKafkaProducer, p: _Pending) -> bool:
        """Return True once every record of `p` (and every chunk before it) is acknowledged,
        or answered instead; False when its dead letter is refused even trimmed (`p.blocked`
        says which record)."""
        for sent in p.chunks:
            await self._settle_chunk(producer, sent)
        i, attempt = 0, 0
        while i < len(p.records):
            record = p.records[i]
            try:
                await p.acks[i]
                i += 1
                continue
            except KafkaError as exc:
                failure = exc
            judged = verdict(failure)
            if judged is Verdict.BROKEN:
                # Its sequence numbers lost after an outage, say: a new producer sends again
                # what this one left unconfirmed (duplicates possible, nothing lost).
                raise ProducerBroken(repr(failure)) from failure
            if judged is Verdict.REFUSED and record.is_result and p.answered is None:
                # A dead letter it already had is kept, and not sent a second time.
                letter_acks = p.acks[1:]
                self._answer_instead(p, refusal_code(failure), f"{record.topic}: {failure!r}")
                self._plan(p)
                p.acks = [await self._send(producer, p.records[0])]
                p.acks += letter_acks or [await self._send(producer, r) for r in p.records[1:]]
                i = 0
                continue
            if judged is Verdict.REFUSED and not record.is_result:
                trimmed = _trimmed_dead_letter(record, failure)
                if trimmed is None:  # refused as small as it gets: it waits for the DLQ
                    p.blocked, p.refusal = i, failure
                    return False
                p.records[i] = trimmed
                p.acks[i] = await self._send(producer, trimmed)
                continue
            if judged is Verdict.REFUSED:
                # Even the small error result is refused: the results topic is misconfigured
                # (or not writable); wait for an operator rather than lose the answer.
                log.error("results_topic_refused", topic=record.topic, error=repr(failure))
            delay = backoff_s(attempt)
            attempt += 1
            self._count("retried")
            log.warning("send_retrying", topic=record.topic, error=repr(failure), retry_in_s=delay)
            await asyncio.sleep(delay)
            p.acks[i] = await self._send(producer, record)
        return True

    async def _settle_chunk(self, producer: AIOKafkaProducer, sent: _SentChunk) -> None:
        """Return once `sent` is acknowledged, or refused for good (then it is dropped)."""
        attempt = 0
        while True:
            if sent.confirmed:
                return
            if sent.ack is None:
                sent.ack = await self._send(producer, sent.record)
            try:
                await sent.ack
                sent.confirmed = True
                self.chunks_sent += 1
                if self.metrics is not None:
                    self.metrics.chunk_sent()
                return
            except KafkaError as exc:
                failure = exc
            judged = verdict(failure)
            if judged is Verdict.BROKEN:
                raise ProducerBroken(repr(failure)) from failure
            if judged is Verdict.REFUSED:
                log.warning("chunk_refused", topic=sent.record.topic, error=repr(failure))
                sent.confirmed = True  # nothing more to do for it
                return
            delay = backoff_s(attempt)
            attempt += 1
            self._count("retried")
            log.warning("send_retrying", topic=sent.record.topic, error=repr(failure))
            await asyncio.sleep(delay)
            sent.ack = await self._send(producer, sent.record)

    def _count(self, action: str) -> None:
        if self.metrics is not None:
            self.metrics.send_failed(action)

    def _delivered(self, p: _Pending) -> None:
        outcome = p.outcome
        p.spans.end(UndeliveredResult(p.answered) if p.answered is not None else None)
        log_outcome(
            outcome,
            p.spans.headers,
            sample_rate=self.config.log_sample_rate,
            payloads=self.config.log_payloads,
        )
        self.results_sent += 1
        if self.metrics is not None:
            self.metrics.observe_outcome(outcome.result, admitted=outcome.admitted)
        self.dead_letters_sent += len(p.records) - 1


def _acknowledged(future: asyncio.Future[object]) -> bool:
    return future.done() and not future.cancelled() and future.exception() is None


def _retrieve(future: asyncio.Future[object]) -> None:
    if not future.cancelled():
        future.exception()


def _trimmed_dead_letter(record: _Record, exc: KafkaError) -> _Record | None:
    """A dead letter the DLQ refused, without its value and the original headers (None when
    it is that already: then it can only wait for the DLQ to take it).

    It keeps the headers tokenmill wrote (its own and Kafka Connect's), each once: the last
    of a name, as the original headers come first. So it is a few KB, whatever the original.
    """
    ours = list({k: v for k, v in record.headers if k in h.DEAD_LETTER_HEADERS}.items())
    if not record.value and list(record.headers) == ours:
        return None
    log.warning("dead_letter_trimmed", topic=record.topic, error=repr(exc))
    return _Record(record.topic, b"", record.key, ours, is_result=False)
