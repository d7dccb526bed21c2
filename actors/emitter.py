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
- a record for a topic the producer does not know (a reply topic deleted after its request
  was admitted, a broker slow to give its metadata) waits apart, at most
  `--topic-metadata-wait-ms`, and is then sent or answered instead (`actors.emit.destinations`):
  one slow destination holds no other result;
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

With `--exactly-once`, results and dead letters go instead through one transactional
producer per input partition (`actors.transactions`): the ingest's `TakeOver` opens them,
its `CommitOffsets` puts the consumed offsets in their transactions, and an outcome is
reported delivered once its transaction commits (chunks stay on the plain producer: a
read_committed reader sees them as they come). One whose partition was handed off or fenced
is reported `Dropped`: the partition's owner answers its record.

A request that failed for a transient reason before its last attempt (`--max-attempts`) is
not answered: its outcome's record is the request, for its next retry topic, sent and
acknowledged (and with `--exactly-once` committed) as a result would be, and then reported
delivered (its offset is done: the retry topic holds it now). The retry topics are checked at
the first start too (`actors.emit.retry_topics`): without them, such a request is
dead-lettered at once.

Its parts are in `actors.emit`: records, planning, retries, chunks, delivery, dead letters,
destinations; its exactly-once side is `actors.transactions.outcomes`.
"""

from __future__ import annotations

import asyncio

import structlog
from aiokafka import AIOKafkaProducer

from actors.config import WorkerConfig
from actors.emit.chunks import ChunkLedger
from actors.emit.dead_letters import DeadLetterTopic
from actors.emit.delivery import Delivery, Settled
from actors.emit.destinations import Destinations
from actors.emit.planning import OutcomePlanner
from actors.emit.records import Pending, SentChunk, acknowledged
from actors.emit.retry_topics import RetryTopics
from actors.kafka.broker_wait import started
from actors.mail import (
    CommitOffsets,
    Delivered,
    HandOff,
    LaneStart,
    Outcome,
    OutcomeBlocked,
    OutcomeWaiting,
    RecordRef,
    StreamChunk,
    TakeOver,
)
from actors.runtime import Actor, Address, Mailbox
from actors.send_errors import DeadLetterBlocked, ProducerBroken, UndeliveredResult, backoff_s
from actors.telemetry.metrics import WorkerMetrics
from actors.telemetry.request_log import log_outcome
from actors.telemetry.tracing import RequestSpans, start_request_spans
from actors.transactions.outcomes import Notice, Settlement, TransactionalOutcomes

log = structlog.get_logger("tokenmill.emitter")


Mail = Outcome | StreamChunk | TakeOver | LaneStart | CommitOffsets | HandOff


class EmitterActor(Actor[Mail]):
    MAILBOX_SIZE = 1024
    BLOCKED_RETRY_S = 5.0  # the longest wait between two sends of a blocked dead letter

    def __init__(
        self,
        config: WorkerConfig,
        mailbox: Mailbox[Mail] | None = None,
        *,
        delivered: Address[Notice] | None = None,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        """`delivered`: the ingest's mailbox, told of each acknowledged outcome and of each
        blocked one (None: no one)."""
        super().__init__("emitter", mailbox or Mailbox(self.MAILBOX_SIZE))
        self.config = config
        self.delivered = delivered
        self.results_sent = 0
        self.dead_letters_sent = 0
        self.chunks_sent = 0  # streamed requests' chunks, acknowledged
        self.planner = OutcomePlanner(count=self._count)
        self.chunks = ChunkLedger()
        self.delivery = Delivery(self.planner, count=self._count, chunk_confirmed=self._chunk_sent)
        self._window = asyncio.Semaphore(config.emit_max_in_flight)
        # Outcomes handed to the producer but not yet acknowledged: produced again when the
        # actor is restarted after a crash, so none is lost (their offsets are uncommitted).
        self._unconfirmed: dict[int, Outcome] = {}
        self.metrics = metrics
        self.blocked_retry_s = self.BLOCKED_RETRY_S
        # Dead letters refused even trimmed, by outcome key: the source record each holds back.
        self.blocked: dict[int, RecordRef] = {}
        self.dead_letters_abandoned = 0  # blocked ones given up at stop (left uncommitted)
        self._dlq = DeadLetterTopic()
        self.retry_topics = RetryTopics()
        self.retries_sent = 0  # requests sent to a retry topic for another attempt
        # With --exactly-once: outcomes go to their input partitions' transactions instead.
        settlement = Settlement(self._report, self._notify, self._taken, self._count)
        self.transactional = TransactionalOutcomes(
            config, self.planner, self.chunks, self.delivery, settlement
        )

    @property
    def answered_instead(self) -> int:
        """Results that could not be delivered, answered with an error result instead."""
        return self.planner.answered_instead

    @property
    def _dlq_checked(self) -> bool:
        return self._dlq.checked

    @_dlq_checked.setter
    def _dlq_checked(self, checked: bool) -> None:
        self._dlq.checked = checked

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
        out = Destinations(
            producer, wait_s=self.config.topic_metadata_wait_ms / 1000, count=self._count
        )
        try:
            # Once, at the first start: `KafkaUnusable` unless this worker may write the DLQ.
            await self._dlq.check(self.config)
            self.planner.retries_usable = await self.retry_topics.check(self.config)
            self._unconfirmed.clear()
            for sent in self.chunks.kept():
                if not sent.confirmed and (sent.ack is None or not acknowledged(sent.ack)):
                    sent.ack = await out.send(sent.record)
            async with asyncio.TaskGroup() as confirms:
                while True:
                    messages: list[Mail]
                    if backlog:
                        messages, backlog = list(backlog), []
                    elif (first := await self.receive()) is not None:
                        messages = [first, *self.drain_mailbox()]
                    else:
                        break
                    group: list[Outcome] = []
                    chunks: list[SentChunk] = []
                    for message in messages:  # before any await: a crash resends all of them
                        if isinstance(message, StreamChunk):
                            chunks.append(self.chunks.record(message))
                        elif isinstance(message, Outcome):
                            self._unconfirmed[id(message)] = message
                            group.append(message)
                        else:
                            confirms.create_task(self.transactional.handle(message))
                    for sent in chunks:  # before any outcome: a request's precede its result
                        sent.ack = await out.send(sent.record)
                    if self.config.exactly_once:
                        confirms.create_task(self.transactional.route(out, group))
                        continue
                    pending = []
                    for outcome in group:
                        await self._window.acquire()
                        spans = start_request_spans(outcome, group=self.config.group)
                        pending.append(await self._produce(out, outcome, spans))
                    confirms.create_task(self._confirm(out, pending, confirms))
            await self.transactional.stop()  # stopped: what the lanes hold is committed first
        finally:
            out.close()
            await producer.stop()
            log.info(
                "emitter_stopped",
                results=self.results_sent,
                dlq=self.dead_letters_sent,
                answered_instead=self.answered_instead,
            )

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

    def _taken(self, p: Pending) -> None:
        self._unconfirmed.pop(p.key, None)

    async def _notify(self, notice: Notice) -> None:
        if self.delivered is not None:
            await self.delivered.send(notice)

    # -- one outcome: its records, their acknowledgements, a blocked dead letter ----------

    async def _produce(self, out: Destinations, outcome: Outcome, spans: RequestSpans) -> Pending:
        """Queue the outcome's records in the producer."""
        p = Pending(outcome, spans, [], [], key=id(outcome))
        p.chunks = self.chunks.of(outcome)
        if p.chunks and p.spans.records:  # on its `process` span
            p.spans.records[0].attributes["tokenmill.stream_chunks"] = len(p.chunks)
        self.planner.plan(p, self.config)
        p.acks = [await out.send(record) for record in p.records]
        return p

    async def _confirm(
        self, out: Destinations, pending: list[Pending], tasks: asyncio.TaskGroup
    ) -> None:
        """Report each of `pending` delivered once settled, in order; one whose dead letter is
        blocked is handed to a task of its own (`_unblock`), with its place in the window, and
        so is one with a record that waits for its topic (`Destinations`)."""
        handed_on = 0
        try:
            for p in pending:
                told = False
                if any(out.waiting(ack) for ack in _acks(p)):
                    if len(pending) > 1:  # the task tells the ingest
                        tasks.create_task(self._confirm(out, [p], tasks))
                        handed_on += 1
                        continue
                    await self._notify(OutcomeWaiting(p.outcome.record))  # it waits apart
                    told = True
                try:
                    settled = await self.delivery.settle(out, p, self.config, apart=not told)
                except BaseException as exc:
                    p.spans.end(exc)
                    raise
                if settled is Settled.DONE:
                    await self._report(p)
                elif settled is Settled.WAITS:  # sent again, it waits for its topic
                    tasks.create_task(self._confirm(out, [p], tasks))
                    handed_on += 1
                else:
                    tasks.create_task(self._unblock(out, p))
                    handed_on += 1
        finally:
            for _ in range(len(pending) - handed_on):
                self._window.release()

    async def _report(self, p: Pending) -> None:
        """`p` is acknowledged: tell the ingest, which may commit its offset."""
        self._delivered(p)
        self.chunks.forget(p.outcome.result.id, p.chunks)
        await self._notify(Delivered(record=p.outcome.record, admitted=p.outcome.admitted,
                                     cost_tokens=p.outcome.cost_tokens))  # fmt: skip
        self._unconfirmed.pop(p.key, None)

    async def _unblock(self, out: Destinations, p: Pending) -> None:
        """Tell the ingest `p` is blocked, send its dead letter again every few seconds until
        the DLQ takes it, then report `p` delivered. Given up at `stop()`: never reported, so
        its offset is never committed (its record is read again: at-least-once). Holds `p`'s
        place in the window until then."""
        source = p.outcome.record
        self.blocked[p.key] = source
        attempt, cap = 0, self.blocked_retry_s
        try:
            await self._notify(OutcomeBlocked(source))
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
                p.acks[p.blocked] = await out.send(record)
                p.blocked = None
                try:  # sets `p.blocked` again if refused
                    await self.delivery.settle(out, p, self.config)
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

    def _count(self, action: str) -> None:
        if self.metrics is not None:
            self.metrics.send_failed(action)

    def _delivered(self, p: Pending) -> None:
        outcome = p.outcome
        if p.retried:  # not an answer: its request runs again
            self._retried(p)
            return
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

    def _retried(self, p: Pending) -> None:
        outcome, record = p.outcome, p.records[0]
        p.spans.end(None)
        reason = outcome.result.error.code.value if outcome.result.error is not None else ""
        log.warning("request_retried", request_id=outcome.result.id[:128], topic=record.topic,
                    attempt=outcome.attempts.number, reason=reason)  # fmt: skip
        self.retries_sent += 1
        if self.metrics is not None:
            self.metrics.retried(reason)

    def _chunk_sent(self) -> None:
        self.chunks_sent += 1
        if self.metrics is not None:
            self.metrics.chunk_sent()


def _acks(p: Pending) -> list[asyncio.Future[object]]:
    """`p`'s acknowledgements: its chunks' not yet settled, then its records'."""
    return [sent.ack for sent in p.chunks if sent.ack is not None and not sent.confirmed] + p.acks
