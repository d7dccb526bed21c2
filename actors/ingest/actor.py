"""IngestActor: Kafka records in → checked, tokenized, length-bucketed `Batch`es out.

Wiring over its parts: a `PartitionReader` (the consumer and its assignment), the `Ledger`
(offsets in flight, commits, fencing, the crash guard), the `Door` (record → request or
refusal), the `Batcher` (buckets, cancels, flushes), `Backpressure` and the `RetryHold`.
It reads the requests topic and its retry topics (`<requests topic>.retry.<N>`, one per
retry of `--max-attempts`) in the same group; a retry runs once its backoff has passed,
its partition paused until then (`actors.ingest.retry_hold`). Every record it reads
ends in exactly one `Outcome` (a result or an error result, plus a dead letter when
undecodable); its offset is committed only after the emitter reports that outcome delivered.

Mailbox: `Delivered`, `OutcomeBlocked` and `OutcomeWaiting` notices from the emitter;
`UseModel` from the GPU actor after a model flip. A drain waits for every outcome but the
blocked ones (a dead letter the DLQ refuses): it commits up to the first of those, which the
partition's next owner reads again (`offset_left_uncommitted`). Outcomes the emitter holds
back (blocked, or waiting for their reply topic) no longer count as running when it decides
whether to wait for a batch to fill.
`cancels`, a second mailbox: `Cancel`s from the cancel actor (see `Batcher`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import structlog
from aiokafka.structs import TopicPartition

from actors.config import WorkerConfig
from actors.ingest.backpressure import Backpressure, Decision
from actors.ingest.batcher import Batcher
from actors.ingest.buckets import LengthBuckets
from actors.ingest.door import Door, Entry
from actors.ingest.envelope import Envelope
from actors.ingest.ledger import Ledger
from actors.ingest.model_front import ModelFront
from actors.ingest.retry_hold import RetryHold
from actors.kafka.consumers import requests_consumer
from actors.kafka.partition_reader import Consumer, PartitionReader, Record, names
from actors.mail import (
    Admitted,
    Batch,
    Cancel,
    Delivered,
    Dropped,
    LaneLost,
    Outcome,
    OutcomeBlocked,
    OutcomeWaiting,
    RecordRef,
    UseModel,
)
from actors.runtime import Actor, Address, Mailbox
from actors.telemetry.metrics import WorkerMetrics
from actors.transactions.client import Request, TransactionsClient

log = structlog.get_logger("tokenmill.ingest")

Mail = Delivered | OutcomeBlocked | OutcomeWaiting | Dropped | LaneLost | UseModel


class IngestActor(Actor[Mail]):
    def __init__(
        self,
        config: WorkerConfig,
        front: ModelFront,
        mailbox: Mailbox[Mail] | None = None,
        *,
        batches: Address[Batch | Cancel],
        outcomes: Address[Outcome],
        metrics: WorkerMetrics | None = None,
        consumer: Callable[[], Consumer] | None = None,
        transactions: Address[Request] | None = None,
    ) -> None:
        """`batches`: the GPU actor's mailbox; `outcomes`: the emitter's (records answered at
        the door go straight there); `consumer`: makes the requests topic's consumer (default:
        `actors.kafka.consumers.requests_consumer`); `transactions`: the emitter's mailbox
        again, with `--exactly-once` (its lanes write the commits)."""
        super().__init__("ingest", mailbox or self.new_mailbox(config))
        self.config = config
        self.front = front
        self.make_consumer = consumer or (lambda: requests_consumer(config))
        self.backpressure = Backpressure(config.watermarks)
        # Outcomes the emitter holds back (`OutcomeBlocked`, `OutcomeWaiting`): admitted, no
        # longer running in the engine.
        self.held: set[RecordRef] = set()
        self.door = Door(config, outcomes, lambda: self.reader.topics())
        self.batcher = Batcher(
            config.bucket_config(front.max_model_len),
            batches=batches,
            outcomes=outcomes,
            model=lambda: self.front.ref,
            worker=config.worker_id,
            stopping=self.stopping,
            metrics=metrics,
        )
        self.cancels = self.batcher.cancels
        self.hold = RetryHold(config.retry_topics)
        self.records_read = 0
        self.answered_again = 0  # exactly-once: records read again that were answered already
        self.transactions = TransactionsClient(transactions) if transactions else None
        self.reader, self.ledger = self._new_reader()

    def _new_reader(self) -> tuple[PartitionReader, Ledger]:
        reader = PartitionReader(
            self.make_consumer,
            name="ingest",
            settings=self.config,
            stopping=self.stopping,
            partitions=self,
            resume_at=lambda tp: self.ledger.fetched_to.get(tp),
        )
        return reader, Ledger(self.config, reader, self.transactions)

    @staticmethod
    def new_mailbox(config: WorkerConfig) -> Mailbox[Mail]:
        """Room for a `Delivered` of every outcome the emitter may have in flight."""
        return Mailbox(max(config.emit_max_in_flight, 1024))

    # -- what the worker and its health read ---------------------------------------------

    @property
    def outstanding(self) -> int:
        """Requests read and not yet answered (queued or running)."""
        return self.backpressure.requests

    @property
    def joined(self) -> bool:
        """The consumer joined its group (has had an assignment, maybe empty)."""
        return self.reader.joined

    @property
    def consumer(self) -> Consumer | None:
        return self.reader.consumer

    @property
    def buckets(self) -> LengthBuckets[Admitted]:
        return self.batcher.buckets

    @property
    def paused_partitions(self) -> int:
        return self.reader.paused

    def lag(self) -> dict[int, int]:
        """Records not yet fetched, per assigned partition of the requests topic."""
        topic = self.config.requests_topic
        return self.reader.lag({tp: o for tp, o in self.ledger.fetched_to.items()
                                if tp.topic == topic})  # fmt: skip

    # -- the actor's life ----------------------------------------------------------------

    async def run(self) -> None:
        # A fresh reader and ledger: a restart holds no partition, fetches each from its commit.
        self.reader, self.ledger = self._new_reader()
        self.hold = RetryHold(self.config.retry_topics)
        topics = [self.config.requests_topic, *self.config.retry_topics]
        if await self.reader.open(topics) is None:
            return  # drained before the broker answered
        log.info("ingest_started", topic=self.config.requests_topic, group=self.config.group,
                 retry_topics=list(self.config.retry_topics))  # fmt: skip
        try:
            async with asyncio.TaskGroup() as tg:
                fetching = tg.create_task(self._fetch_loop())
                flushing = tg.create_task(self.batcher.flush_loop())
                mail = tg.create_task(self._mail_loop())
                cancelling = tg.create_task(self.batcher.cancel_loop())
                committing = tg.create_task(self.ledger.commit_loop())
                holding = tg.create_task(self.hold.resume_loop(self._resume_due))
                await fetching
                self.batcher.wake()  # the flush loop sees `stopping`
                await flushing
                # Draining: what sits in buckets runs now; then wait for every outcome.
                await self.batcher.drain()
                await self.ledger.wait_quiet()
                mail.cancel()
                cancelling.cancel()
                committing.cancel()
                holding.cancel()
            await self.ledger.commit_assigned(release=True)
        finally:
            await self.reader.close()
            log.info("ingest_stopped", records=self.records_read)

    # -- records in ----------------------------------------------------------------------

    async def _fetch_loop(self) -> None:
        self.ledger.start_clock()
        while not self.stopping.is_set():
            # Never fetch more than the watermark has room for: a whole fetched batch is
            # admitted before the next pause can take effect.
            limit = min(self.config.fetch_max_records, self.backpressure.room)
            if (fetched := await self.reader.fetch(limit)) is None:
                continue
            # What getmany returns belongs to the assignment current now; a rebalance while
            # it is handled resets the positions to the last commit (eager protocol).
            generation = self.reader.generation
            # Retries not due yet stay on their topic, their partition paused until they are.
            if (consumer := self.reader.consumer) is not None:
                fetched = self.hold.split(consumer, fetched)
            if not await self.ledger.claim(fetched, generation):
                continue
            for records in fetched.values():
                for chunk, isolated in self.ledger.chunks(records):
                    await self._read(chunk, generation)
                    if isolated:
                        await self.batcher.drain("isolated")
                        tp = TopicPartition(chunk[0].topic, chunk[0].partition)
                        await self.ledger.settle(tp, chunk[-1].offset, generation)
            if self.backpressure.requests - len(self.held) == len(self.batcher):
                # Nothing is running: waiting to fill a batch would only add latency, and
                # whatever arrives next joins the running batch at the engine's next step.
                await self.batcher.drain("idle")

    async def _read(self, records: Sequence[Record], generation: int) -> None:
        """A partition's fetched records through the door; the good ones tokenized, bucketed."""
        entries: list[Entry] = []
        with self.batcher.arriving() as arriving:
            for record in records:
                if generation != self.reader.generation:
                    # A rebalance ran while this fetch was handled: the rest of it is read
                    # again from the last commit by whoever owns the partition now.
                    break
                envelope = Envelope.of(record)
                self.ledger.track(envelope.record)
                self.records_read += 1
                if self.ledger.answered_already(envelope.record):
                    self.ledger.done(envelope.record)  # its result is committed already
                    self.answered_again += 1
                    continue
                try:
                    deaths = self.ledger.quarantined(envelope.record)
                    if (entry := await self.door.enter(record, envelope, deaths)) is not None:
                        entries.append(entry)
                        arriving.add(entry.request.id)
                except Exception as exc:  # a bug: this record's answer, not the actor's crash
                    kind = envelope.kind(record.value)
                    await self.door.refusals.internal_error(envelope, exc, kind)
            await self._bucket(entries)

    async def _bucket(self, entries: list[Entry]) -> None:
        """Tokenize the requests that passed the door and place them in their buckets."""
        # A flip meanwhile: the GPU actor tokenizes these again.
        for item in await self.door.tokenized(entries, self.front):
            self._account(self.backpressure.admit(1, item.cost_tokens))
            await self.batcher.add(item, len(item.prompt_token_ids))

    # -- notices in, backpressure, rebalances ---------------------------------------------

    async def _mail_loop(self) -> None:
        while True:
            first = await self.mailbox.get()
            for mail in [first, *self.drain_mailbox()]:
                match mail:
                    case UseModel(front=front):
                        self.front = front
                        log.info("ingest_model", model=front.name, digest=front.digest)
                    case OutcomeBlocked(record=ref):
                        self.ledger.block(ref)
                        self.held.add(ref)
                    case OutcomeWaiting(record=ref):
                        self.held.add(ref)
                    case Delivered(record=ref, admitted=admitted, cost_tokens=cost):
                        self.ledger.done(ref)
                        self.held.discard(ref)
                        if admitted:
                            self._account(self.backpressure.release(1, cost))
                    case Dropped(record=ref, admitted=admitted, cost_tokens=cost):
                        self.held.discard(ref)
                        if admitted:  # its partition's owner answers it
                            self._account(self.backpressure.release(1, cost))
                    case LaneLost(tp=tp, reason=reason):
                        self.ledger.lane_lost(tp, reason)
            self.ledger.notify()

    def _account(self, decision: Decision) -> None:
        consumer = self.reader.consumer
        if consumer is None or decision is Decision.NONE:
            return
        if decision is Decision.PAUSE:
            self.reader.pause_all()
        else:
            self.reader.resume_all()
            if held := self.hold.still_held():  # they wait for their retries' backoff
                consumer.pause(*held)
        event = "partitions_paused" if decision is Decision.PAUSE else "partitions_resumed"
        log.info(event, requests=self.backpressure.requests, tokens=self.backpressure.tokens)

    def _resume_due(self, partitions: list[TopicPartition]) -> None:
        """Retry partitions whose next record is due now fetch again (unless backpressure
        pauses every partition: its resume resumes them too)."""
        consumer = self.reader.consumer
        if consumer is None or self.backpressure.paused:
            return
        assigned = consumer.assignment()
        consumer.resume(*(tp for tp in partitions if tp in assigned))

    async def assigned(self, consumer: Consumer, assigned: set[TopicPartition]) -> None:
        self.hold.forget(assigned)
        await self.ledger.assigned(consumer, assigned)
        if self.backpressure.paused:
            consumer.pause(*assigned)
        log.info("partitions_assigned", partitions=names(assigned))

    async def revoked(self, consumer: Consumer, revoked: set[TopicPartition]) -> None:
        self.hold.forget(revoked)
        await self.ledger.revoked(consumer, revoked)
        log.info("partitions_revoked", partitions=names(revoked))
