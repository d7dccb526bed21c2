"""IngestActor: Kafka records in → checked, tokenized, length-bucketed `Batch`es out.

Owns the consumer, the `OffsetTracker` and the backpressure state. Every record it reads ends
in exactly one `Outcome` (a result or an error result, plus a dead letter when undecodable);
its offset is committed only after the emitter reports that outcome delivered.

Mailbox: `Delivered` and `OutcomeBlocked` notices from the emitter; `UseModel` from the GPU
actor after a model flip. A drain waits for every outcome but the blocked ones (a dead letter
the DLQ refuses): it commits up to the first of those, which the partition's next owner reads
again (`offset_left_uncommitted`).
`cancels`, a second mailbox: `Cancel`s from the cancel actor. A cancelled request still in a
length bucket is answered here (cancelled, no tokens); any other cancel is passed on to the
GPU actor behind the batches already handed over, so it finds the request if it is there.
Every cancel's id is also remembered a while (`RecentCancels`): a request that arrives after
its cancel is answered cancelled at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable, Sequence
from dataclasses import replace

import structlog
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener
from aiokafka.errors import KafkaError
from aiokafka.structs import ConsumerRecord, TopicPartition

from actors.cancel.remembered import RecentCancels
from actors.config import WorkerConfig
from actors.ingest.backpressure import Backpressure, Decision
from actors.ingest.buckets import Flushed, LengthBuckets
from actors.ingest.committer import Committer
from actors.ingest.crash_guard import CrashGuard
from actors.ingest.door import check, tokenize_all
from actors.ingest.model_front import ModelFront
from actors.ingest.offsets import OffsetTracker
from actors.ingest.refusals import Refusals
from actors.ingest.reply_topics import KnownTopics, ReplyPolicy, ReplyTopics
from actors.kafka import record_reader
from actors.kafka.broker_wait import started
from actors.mail import (
    Admitted,
    Batch,
    Cancel,
    Delivered,
    Outcome,
    OutcomeBlocked,
    RecordRef,
    UseModel,
)
from actors.results import cancelled_before_engine
from actors.runtime import Actor, Address, Mailbox
from actors.telemetry.metrics import WorkerMetrics
from messages import headers as h
from messages.codec import normalize_content_type
from messages.error_codes import ErrorCode
from messages.errors import InvalidRequest, UndecodableRequest
from messages.headers import Headers
from messages.request import GenerateRequest
from messages.request_decoding import decode_request

log = structlog.get_logger("tokenmill.ingest")

_POLL_MS = 100


class IngestActor(Actor[Delivered | OutcomeBlocked | UseModel]):
    def __init__(
        self,
        config: WorkerConfig,
        front: ModelFront,
        mailbox: Mailbox[Delivered | OutcomeBlocked | UseModel] | None = None,
        *,
        batches: Address[Batch | Cancel],
        outcomes: Address[Outcome],
        metrics: WorkerMetrics | None = None,
    ) -> None:
        """`batches`: the GPU actor's mailbox; `outcomes`: the emitter's (records answered at
        the door go straight there)."""
        super().__init__("ingest", mailbox or self.new_mailbox(config))
        self.config = config
        self.front = front
        self.batches = batches
        self.outcomes = outcomes
        self.tracker = OffsetTracker()
        self.guard = CrashGuard(config.max_record_crashes)
        self.committer = Committer(self.tracker, self.guard, headroom=config.fetch_max_records)
        self.backpressure = Backpressure(config.watermarks)
        self.buckets: LengthBuckets[Admitted] = LengthBuckets(
            config.bucket_config(front.max_model_len)
        )
        self.consumer: AIOKafkaConsumer | None = None
        own = (
            config.requests_topic,
            config.dlq_topic,
            config.control_topic,
            config.events_topic,
            config.cancel_topic,
        )
        policy = ReplyPolicy.of(
            results_topic=config.results_topic, own_topics=own, allowed=config.allowed_reply_to
        )
        self.reply_topics = ReplyTopics(policy, KnownTopics(self._list_topics))
        self.refusals = Refusals(config, self.reply_topics, outcomes)
        self.records_read = 0
        self.fetch_failures = 0
        self.metrics = metrics
        self.joined = False  # the consumer joined its group (has had an assignment, maybe empty)
        self.fetched_to: dict[TopicPartition, int] = {}  # next offset to fetch, per partition
        self._bucket_added = asyncio.Event()
        self._quiet = asyncio.Event()  # set when all in flight is delivered, or blocked
        self._delivered = asyncio.Event()  # set by every delivery
        # Bumped by every rebalance: a fetch made under an older assignment is not tracked
        # past the rebalance (its partitions may have been revoked and handed back, with
        # fetching restarted at the last commit).
        self._generation = 0
        # A fetch loop stalled past this (the process stopped, the event loop blocked, and
        # heartbeats with it) may have outlived the session: the group may have handed its
        # partitions on. The last heartbeat came at most one interval (aiokafka's 3 s) before
        # the stall, so only a stall past session - 3 s (at least half the broker's minimum
        # session of 6 s) can cost the membership; past a third, this member asks the group
        # (a commit) before it runs what it fetched. A slow loop on a live event loop costs
        # that one commit.
        self._stall_s = config.session_timeout_ms / 3000
        self._fenced: int | None = None  # a generation the group fenced: its fetches are dropped
        # Cancellation: the cancel actor's mailbox; the ids read and not yet in a bucket (a
        # cancel for one waits until it is); batches are handed over, and cancels passed on,
        # one at a time, so a cancel never overtakes the batch that holds its request.
        self.cancels: Mailbox[Cancel] = Mailbox(256)
        self.recent_cancels = RecentCancels()  # for requests that arrive after their cancel
        self._arriving: set[str] = set()
        self._bucketed = asyncio.Event()
        self._handover = asyncio.Lock()

    @property
    def outstanding(self) -> int:
        """Requests read and not yet answered (queued or running)."""
        return self.backpressure.requests

    @property
    def paused_partitions(self) -> int:
        consumer = self.consumer
        return len(consumer.paused()) if consumer is not None and self.joined else 0

    @staticmethod
    def new_mailbox(config: WorkerConfig) -> Mailbox[Delivered | OutcomeBlocked | UseModel]:
        """Room for a `Delivered` of every outcome the emitter may have in flight."""
        return Mailbox(max(config.emit_max_in_flight, 1024))

    # -- the actor's life ----------------------------------------------------------------

    async def run(self) -> None:
        self._forget_partitions()
        consumer = await started(
            self._new_consumer, name="ingest", stopping=self.stopping, settings=self.config
        )
        if consumer is None:
            return  # drained before the broker answered
        log.info("ingest_started", topic=self.config.requests_topic, group=self.config.group)
        try:
            async with asyncio.TaskGroup() as tg:
                fetching = tg.create_task(self._fetch_loop(consumer))
                flushing = tg.create_task(self._flush_loop())
                mail = tg.create_task(self._mail_loop())
                cancelling = tg.create_task(self._cancel_loop())
                committing = tg.create_task(self._commit_loop(consumer))
                await fetching
                self._bucket_added.set()  # wakes the flush loop, which sees `stopping`
                await flushing
                # Draining: what sits in buckets runs now; then wait for every outcome.
                await self._flush(self.buckets.drain())
                await self._wait_quiet()
                mail.cancel()
                cancelling.cancel()
                committing.cancel()
            await self.committer.commit(
                consumer, consumer.assignment(), self.fetched_to, release=True
            )
        finally:
            await consumer.stop()
            log.info("ingest_stopped", records=self.records_read)

    def _forget_partitions(self) -> None:
        """Start (or restart, after a crash) holding no partition: the new consumer fetches
        each one from its last commit. Outcomes of the crashed run's records still arrive;
        they are no longer tracked (their records are read again: at-least-once), so a drain
        waits for none of them."""
        self.joined = False
        self._generation += 1
        self._fenced = None
        self.tracker = OffsetTracker()
        self.guard = CrashGuard(self.config.max_record_crashes)
        self.committer = Committer(self.tracker, self.guard, headroom=self.config.fetch_max_records)
        self.fetched_to = {}

    def _new_consumer(self) -> AIOKafkaConsumer:
        record_reader.install()  # no record in a fetch can make getmany() raise
        self.consumer = consumer = AIOKafkaConsumer(
            **self.config.kafka.client_kwargs(),
            group_id=self.config.group,
            group_instance_id=self.config.group_instance_id,
            session_timeout_ms=self.config.session_timeout_ms,
            client_id=f"tokenmill-{self.config.worker_id}",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_partition_fetch_bytes=self.config.max_request_bytes + (64 << 10),
            fetch_max_wait_ms=self.config.fetch_max_wait_ms,
        )
        consumer.subscribe([self.config.requests_topic], listener=_Rebalance(self))
        return consumer

    async def _list_topics(self) -> set[str]:
        if self.consumer is None:
            raise KafkaError("the consumer is not started")
        return set(await self.consumer.topics())

    async def _wait_quiet(self) -> None:
        """Until every outcome is delivered but those the emitter holds back (`OutcomeBlocked`),
        for which nothing more comes in this run: each such partition's commits stop at its
        first blocked offset."""
        while self.tracker.waiting() > 0:
            self._quiet.clear()
            await self._quiet.wait()
        for tp, offsets in self.tracker.blocked().items():
            log.warning("offset_left_uncommitted", topic=tp.topic, partition=tp.partition,
                        offset=offsets[0], blocked=len(offsets), reason="dead letter blocked",
                        detail="read again by the partition's next owner")  # fmt: skip

    # -- fetching ------------------------------------------------------------------------

    async def _fetch_loop(self, consumer: AIOKafkaConsumer) -> None:
        fetched_at, stalled = time.monotonic(), False
        while not self.stopping.is_set():
            # Never fetch more than the watermark has room for: a whole fetched batch is
            # admitted before the next pause can take effect.
            limit = min(self.config.fetch_max_records, self.backpressure.room)
            try:
                fetched = await consumer.getmany(timeout_ms=_POLL_MS, max_records=limit)
            except KafkaError:
                raise  # the broker's side: the supervisor's restart and backoff
            except Exception as exc:  # a record aiokafka cannot hand out (record_reader's gap)
                await self._fetch_failed(consumer, exc)
                continue
            # What getmany returns belongs to the assignment current now; a rebalance while
            # it is handled resets the positions to the last commit (eager protocol).
            generation = self._generation
            now = time.monotonic()
            # Until the next records: back from a stop, getmany first returns nothing (its
            # timeout ran out meanwhile), and the old assignment's records a moment later.
            stalled, fetched_at = stalled or now - fetched_at > self._stall_s, now
            if not fetched:
                continue
            owned = await self._on_record(consumer, fetched, generation, stalled)
            stalled = False
            if not owned:
                continue
            for records in fetched.values():
                await self._ingest(records, generation)
            if self.backpressure.requests == len(self.buckets):
                # Nothing is running: waiting to fill a batch would only add latency, and
                # whatever arrives next joins the running batch at the engine's next step.
                await self._flush(self.buckets.drain("idle"))

    async def _fetch_failed(self, consumer: AIOKafkaConsumer, exc: Exception) -> None:
        """A fetch raised on its records, not on the broker: fetch again from the first record
        not yet handled on each partition, after a pause (records handed out before the
        failure in this fetch were lost with it)."""
        self.fetch_failures += 1
        log.error("fetch_failed", error=repr(exc)[:500], failures=self.fetch_failures)
        for tp in consumer.assignment():
            if tp in self.fetched_to:
                consumer.seek(tp, self.fetched_to[tp])
            else:
                await consumer.seek_to_committed(tp)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), min(0.1 * 2**self.fetch_failures, 5))

    async def _on_record(
        self,
        consumer: AIOKafkaConsumer,
        fetched: dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]],
        generation: int,
        stalled: bool,
    ) -> bool:
        """Put what was fetched on record as in flight before it runs (crash_guard); False
        when it must not run: the group fenced this member (a zombie, back from a stall).

        aiokafka learns that it was fenced only from a heartbeat or a commit, and its fetcher
        hands out records of the old assignment until then. Dropped records were never
        tracked: the rejoin that follows every fenced commit reads the new assignment's
        positions from the last commits, so their owners (maybe this worker) run them."""
        if self._fenced == generation:
            return False
        if await self.committer.fetched(
            consumer,
            {tp: r[0].offset for tp, r in fetched.items()},
            {tp: r[-1].offset + 1 for tp, r in fetched.items()},
            verify=stalled,
        ):
            return True
        self._fenced = generation
        log.warning("fetch_dropped_fenced", partitions=_names(fetched),
                    records=sum(len(r) for r in fetched.values()))  # fmt: skip
        return False

    async def _ingest(
        self, records: Sequence[ConsumerRecord[bytes, bytes]], generation: int
    ) -> None:
        """A partition's fetched records; suspects (in flight when a worker died) run in
        isolated chunks first (see `crash_guard`)."""
        tp = TopicPartition(records[0].topic, records[0].partition)
        start = 0
        while start < len(records):
            end = self.guard.chunk_end(tp, records[start].offset)
            if end is None:
                await self._ingest_records(records[start:], generation)
                return
            stop = start
            while stop < len(records) and records[stop].offset < end:
                stop += 1
            await self._ingest_isolated(tp, records[start:stop], generation)
            start = stop

    async def _ingest_isolated(
        self, tp: TopicPartition, chunk: Sequence[ConsumerRecord[bytes, bytes]], generation: int
    ) -> None:
        """Run a chunk of suspects with nothing else of their partition and commit past it
        once done: if the worker dies meanwhile, the chunk is what was in flight."""
        first, last = chunk[0].offset, chunk[-1].offset
        log.info("records_isolated", topic=tp.topic, partition=tp.partition, first=first,
                 last=last)  # fmt: skip
        await self._ingest_records(chunk, generation)
        await self._flush(self.buckets.drain("isolated"))
        while generation == self._generation and not self.stopping.is_set():
            point = self.tracker.commit_point(tp)
            if point is None or point > last:
                break
            self._delivered.clear()
            await self._delivered.wait()
        if self.consumer is not None and generation == self._generation:
            await self.committer.commit(self.consumer, [tp], self.fetched_to)

    async def _ingest_records(
        self, records: Sequence[ConsumerRecord[bytes, bytes]], generation: int
    ) -> None:
        """Decode and check a partition's fetched records, tokenize the good ones, queue them."""
        accepted: list[tuple[RecordRef, GenerateRequest, str, Headers, float | None]] = []
        for record in records:
            ref = RecordRef(
                record.topic, record.partition, record.offset, record.timestamp, record.key
            )
            if generation != self._generation:
                # A rebalance ran while this fetch was handled: the rest of it is read again
                # from the last commit by whoever owns the partition now.
                break
            if (before := self.tracker.track(ref.tp, ref.offset)) is not None:
                log.warning("offset_rewound", topic=ref.topic, partition=ref.partition,
                            offset=ref.offset, previous=before)  # fmt: skip
            self.fetched_to[ref.tp] = ref.offset + 1
            self.records_read += 1
            headers = record_reader.readable_headers(record.headers)
            try:
                if (admitted := await self._door(ref, record, headers)) is not None:
                    accepted.append(admitted)
                    self._arriving.add(admitted[1].id)
            except Exception as exc:  # a bug: this record's answer, not the actor's crash
                await self._internal_error(ref, exc, headers)
        try:
            await self._bucket(accepted)
        finally:
            self._arriving.clear()
            self._bucketed.set()

    async def _door(
        self, ref: RecordRef, record: ConsumerRecord[bytes, bytes], headers: Headers
    ) -> tuple[RecordRef, GenerateRequest, str, Headers, float | None] | None:
        """One record at the door: what to tokenize, or None when it was answered here."""
        if (deaths := self.guard.quarantined(ref.tp, ref.offset)) is not None:
            await self.refusals.quarantine(ref, record.value, headers, deaths)
            return None
        if (reason := record_reader.unreadable(record)) is not None:
            await self.refusals.unreadable(ref, record.value, headers, reason)
            return None
        raw_ctype = h.header(headers, h.CONTENT_TYPE)
        try:
            request = decode_request(
                record.value, raw_ctype, max_bytes=self.config.max_request_bytes, key=ref.key
            )
        except UndecodableRequest as exc:
            await self.refusals.reject(ref, exc, record.value, headers)
            return None
        try:
            deadline = check(request, record.timestamp)
            await self.reply_topics.check(request.reply_to)
        except InvalidRequest as exc:
            await self.refusals.reject(ref, exc, None, headers, request=request)
            return None
        return ref, request, normalize_content_type(raw_ctype), headers, deadline

    async def _internal_error(self, ref: RecordRef, exc: Exception, headers: Headers) -> None:
        """Answer a record whose admission failed unexpectedly (`internal_error`); the actor
        goes on with the next one."""
        log.exception("record_internal_error", topic=ref.topic, partition=ref.partition,
                      offset=ref.offset)  # fmt: skip
        error = InvalidRequest(
            ErrorCode.INTERNAL_ERROR,
            f"the worker failed admitting this record ({type(exc).__name__}); it was not run",
        )
        await self.refusals.reject(ref, error, None, headers)

    async def _bucket(
        self, accepted: list[tuple[RecordRef, GenerateRequest, str, Headers, float | None]]
    ) -> None:
        """Tokenize the accepted requests and place them in their buckets."""
        if not accepted:
            return
        # Tokenizers release the GIL: a fetched batch tokenizes off the event loop.
        loop = asyncio.get_running_loop()
        front = self.front  # a flip meanwhile: the GPU actor tokenizes these again
        tokens = await loop.run_in_executor(None, tokenize_all, front, [a[1] for a in accepted])
        now = time.monotonic()
        for (ref, request, ctype, headers, deadline), ids in zip(accepted, tokens, strict=True):
            if isinstance(ids, InvalidRequest):
                await self.refusals.reject(ref, ids, None, headers, request=request)
                continue
            try:
                item = Admitted(
                    request=request,
                    record=ref,
                    prompt_token_ids=ids,
                    reply_topic=request.reply_to or self.config.results_topic,
                    content_type=ctype,
                    trace=h.trace_headers(headers),
                    consumed_at=now,
                    deadline=deadline,
                    model_digest=front.digest,
                )
                cost = item.cost_tokens
            except Exception as exc:  # a bug: this record's answer, not the actor's crash
                await self._internal_error(ref, exc, headers)
                continue
            self._account(self.backpressure.admit(1, cost))
            if request.id in self.recent_cancels:  # its cancel came before it
                await self._cancelled_on_arrival(item)
                continue
            await self._flush(self.buckets.add(item, len(ids)))
            self._bucket_added.set()

    # -- batching ------------------------------------------------------------------------

    async def _flush(self, flushed: Iterable[Flushed[Admitted]]) -> None:
        async with self._handover:  # taken before yielding: no cancel passes these batches
            await self._hand_over(flushed)

    async def _hand_over(self, flushed: Iterable[Flushed[Admitted]]) -> None:
        for f in flushed:
            if self.metrics is not None:
                self.metrics.observe_batch(len(f.items), f.tokens, f.reason)
            log.debug(
                "batch_flushed",
                bucket=f.bucket,
                size=len(f.items),
                tokens=f.tokens,
                reason=f.reason,
                oldest_wait_ms=round(f.oldest_wait_s * 1000, 2),
            )
            await self.batches.send(
                Batch(bucket=f.bucket, items=f.items, tokens=f.tokens, reason=f.reason)
            )

    async def _flush_loop(self) -> None:
        while not self.stopping.is_set():
            deadline = self.buckets.next_deadline()
            self._bucket_added.clear()
            if deadline is None:
                await self._bucket_added.wait()
                continue
            delay = deadline - time.monotonic()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._bucket_added.wait(), delay)
            await self._flush(self.buckets.due())

    # -- cancellation --------------------------------------------------------------------

    async def _cancel_loop(self) -> None:
        while True:
            cancel = await self.cancels.get()
            while cancel.request_id in self._arriving:  # read, not yet in a bucket
                self._bucketed.clear()
                await self._bucketed.wait()
            async with self._handover:
                await self._cancel(cancel)

    async def _cancel(self, cancel: Cancel) -> None:
        """Answer a cancelled request held in a bucket, and pass the cancel on (the GPU actor
        may hold it, or a copy of it: a redelivery)."""
        request_id = cancel.request_id
        self.recent_cancels.add(request_id)
        taken = self.buckets.remove(lambda item: item.request.id == request_id)
        await self.batches.send(replace(cancel, answered=True) if taken else cancel)
        if not taken:
            return
        log.info("request_cancelled", request_id=request_id, where="bucket", reason=cancel.reason)
        if self.metrics is not None:
            self.metrics.observe_cancel("bucket")
        for item in taken:
            outcome = cancelled_before_engine(
                item, model=self.front.ref, worker=self.config.worker_id, where="bucket"
            )
            await self.outcomes.send(outcome)

    async def _cancelled_on_arrival(self, item: Admitted) -> None:
        log.info("request_cancelled", request_id=item.request.id, where="arrival")
        if self.metrics is not None:
            self.metrics.observe_cancel("arrival")
        await self.outcomes.send(
            cancelled_before_engine(
                item, model=self.front.ref, worker=self.config.worker_id, where="arrival"
            )
        )

    # -- deliveries, backpressure, commits -----------------------------------------------

    async def _mail_loop(self) -> None:
        while True:
            first = await self.mailbox.get()
            for mail in [first, *self.drain_mailbox()]:
                match mail:
                    case UseModel(front=front):
                        self.front = front
                        log.info("ingest_model", model=front.name, digest=front.digest)
                    case OutcomeBlocked(record=ref):
                        self.tracker.block(ref.tp, ref.offset)
                    case Delivered(record=ref, admitted=admitted, cost_tokens=cost):
                        self.tracker.done(ref.tp, ref.offset)
                        if admitted:
                            self._account(self.backpressure.release(1, cost))
            self._delivered.set()
            if self.tracker.waiting() == 0:
                self._quiet.set()

    def _account(self, decision: Decision) -> None:
        consumer = self.consumer
        if consumer is None or decision is Decision.NONE:
            return
        if decision is Decision.PAUSE:
            consumer.pause(*consumer.assignment())
        else:
            consumer.resume(*consumer.assignment())
        event = "partitions_paused" if decision is Decision.PAUSE else "partitions_resumed"
        log.info(event, requests=self.backpressure.requests, tokens=self.backpressure.tokens)

    async def _commit_loop(self, consumer: AIOKafkaConsumer) -> None:
        """Commit the contiguous-done offsets of the partitions still assigned, now and then."""
        while True:
            await asyncio.sleep(self.config.commit_interval_s)
            await self.committer.commit(consumer, consumer.assignment(), self.fetched_to)

    async def on_revoked(self, revoked: set[TopicPartition]) -> None:
        consumer = self.consumer
        if consumer is None:
            return
        self._generation += 1
        await self.committer.commit(consumer, revoked, self.fetched_to, release=True)
        self.tracker.revoke(revoked)
        self.committer.forget(revoked)
        for tp in revoked:
            self.fetched_to.pop(tp, None)
        log.info("partitions_revoked", partitions=_names(revoked))

    def lag(self) -> dict[int, int]:
        """Records not yet fetched, per assigned partition of the requests topic (from the
        high watermark of the last fetch; partitions not fetched from yet are left out)."""
        consumer = self.consumer
        if consumer is None or not self.joined:
            return {}
        out = {}
        for tp in consumer.assignment():
            high = consumer.highwater(tp)
            if high is not None and tp in self.fetched_to:
                out[tp.partition] = max(high - self.fetched_to[tp], 0)
        return out

    async def on_assigned(self, assigned: set[TopicPartition]) -> None:
        # Fetching restarts at the last commit: forget whatever a stale earlier
        # assignment left, so offsets are tracked afresh.
        self._generation += 1
        self.joined = True
        self.tracker.revoke(assigned)
        self.committer.forget(assigned)
        if self.consumer is not None:
            await self.committer.take_over(self.consumer, assigned)
        if self.backpressure.paused and self.consumer is not None:
            self.consumer.pause(*assigned)
        log.info("partitions_assigned", partitions=_names(assigned))


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, ingest: IngestActor) -> None:
        self.ingest = ingest

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self.ingest.on_revoked(revoked)

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        await self.ingest.on_assigned(assigned)


def _names(tps: Iterable[TopicPartition]) -> list[str]:
    return sorted(f"{tp.topic}/{tp.partition}" for tp in tps)
