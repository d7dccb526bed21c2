"""CancelActor: `CancelRequest`s in from the cancel topic, `Cancel`s out to the ingest.

Reads the cancel topic in a consumer group of its own (`<group>.cancel.<worker id>`), so every
worker sees every cancel, whichever worker holds the request. It never commits: on each
assignment it starts from the cancels of the last `REMEMBER_S` seconds (the offsets for that
time), the window the ingest remembers cancelled ids for, so a worker started (or restarted)
after a cancel still answers its request cancelled when it arrives. A record that does not
decode is counted and logged (`cancel_malformed`), never a crash. A cancel topic that does
not exist (yet) is logged once (`cancel_topic_missing`) and looked for again every
`topic_recheck_s`; the consumer subscribes once it is there (left to the consumer, a missing
topic is asked for ten times a second, for ever).

Mailbox: none used (it only reads). Sends: `Cancel` to `cancels` (the ingest, which takes the
request out of its buckets or passes the cancel on to the GPU actor). `ready` is set once the
consumer's positions are resolved: a cancel produced after that is seen. `stop()`: stop
reading, close. `run()` may be called again after it raised; it makes a fresh consumer.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import msgspec
import structlog
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener
from aiokafka.structs import ConsumerRecord, TopicPartition

from actors.cancel.remembered import REMEMBER_S
from actors.config import WorkerConfig
from actors.kafka.assignment_ready import ready_on_each_assignment
from actors.kafka.broker_wait import started
from actors.mail import Cancel
from actors.runtime import Actor, Address
from messages import headers as h
from messages.cancel import CancelRequest, cancel_codec
from messages.codec import normalize_content_type
from messages.errors import UnsupportedContentType

log = structlog.get_logger("tokenmill.cancel")

_POLL_MS = 100
TOPIC_RECHECK_S = 10.0


def decode_cancel(value: bytes | None, content_type: bytes | None) -> CancelRequest | str:
    """The cancel in a record's value, or why it is not one."""
    try:
        cancel = cancel_codec.decode(value or b"", normalize_content_type(content_type))
    except (msgspec.DecodeError, RecursionError, UnsupportedContentType) as exc:
        return str(exc)
    if not cancel.id:
        return "a cancel needs the id of the request to cancel"
    return cancel


class CancelActor(Actor[None]):
    def __init__(self, config: WorkerConfig, cancels: Address[Cancel]) -> None:
        """`cancels`: the ingest's mailbox."""
        super().__init__("cancel", 1)
        if config.cancel_topic is None:
            raise ValueError("a CancelActor needs config.cancel_topic")
        self.config = config
        self.topic: str = config.cancel_topic
        self.cancels = cancels
        self.ready = asyncio.Event()
        self.received = 0
        self.malformed = 0
        self._assigned = asyncio.Event()  # set by the rebalance listener
        self.clock = time.time
        self.topic_recheck_s = TOPIC_RECHECK_S

    @property
    def listening(self) -> bool:
        """Assigned the cancel topic with its positions resolved (for readiness)."""
        return self.ready.is_set()

    def _new_consumer(self) -> AIOKafkaConsumer:
        consumer = AIOKafkaConsumer(
            **self.config.kafka.client_kwargs(),
            group_id=f"{self.config.group}.cancel.{self.config.worker_id}",
            client_id=f"tokenmill-{self.config.worker_id}-cancel",
            auto_offset_reset="latest",  # never committed: positions come from `_rewind`
            enable_auto_commit=False,
        )
        return consumer  # subscribed by `run` once the topic exists

    async def _topic_found(self, consumer: AIOKafkaConsumer) -> bool:
        """True once the cancel topic exists (one metadata request every `topic_recheck_s`,
        one warning while it is missing); False if the actor is stopped first."""
        missing_since: float | None = None
        while not self.stopping.is_set():
            if self.topic in await consumer.topics():
                if missing_since is not None:
                    waited = round(time.monotonic() - missing_since, 1)
                    log.info("cancel_topic_found", topic=self.topic, waited_s=waited)
                return True
            if missing_since is None:
                missing_since = time.monotonic()
                log.warning(
                    "cancel_topic_missing",
                    topic=self.topic,
                    recheck_s=self.topic_recheck_s,
                    detail="cancels are not read until the topic exists",
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), self.topic_recheck_s)
        return False

    async def _rewind(self, consumer: AIOKafkaConsumer, assigned: set[TopicPartition]) -> None:
        """Start each assigned partition at its first cancel of the last REMEMBER_S seconds
        (at its end when it has none that recent)."""
        if not assigned:
            return
        since_ms = int((self.clock() - REMEMBER_S) * 1000)
        found = await consumer.offsets_for_times({tp: since_ms for tp in assigned})
        recent = {tp: at.offset for tp, at in found.items() if at is not None}
        for tp, offset in recent.items():
            consumer.seek(tp, offset)
        if stale := [tp for tp in assigned if tp not in recent]:
            await consumer.seek_to_end(*stale)

    async def run(self) -> None:
        self.ready.clear()
        self._assigned.clear()
        consumer = await started(
            self._new_consumer, name="cancel", stopping=self.stopping, settings=self.config
        )
        if consumer is None:
            return
        try:
            if not await self._topic_found(consumer):
                return
            consumer.subscribe([self.topic], listener=_Assigned(self, consumer))
            log.info("cancel_started", topic=self.topic)
            async with asyncio.TaskGroup() as tg:
                positions = tg.create_task(self._ready_loop(consumer))
                await self._read_loop(consumer)
                positions.cancel()
        finally:
            self.ready.clear()
            await consumer.stop()
            log.info("cancel_stopped", received=self.received, malformed=self.malformed)

    async def _read_loop(self, consumer: AIOKafkaConsumer) -> None:
        while not self.stopping.is_set():
            fetched = await consumer.getmany(timeout_ms=_POLL_MS)
            for records in fetched.values():
                for record in records:
                    await self._handle(record)

    async def _handle(self, record: ConsumerRecord[bytes, bytes]) -> None:
        headers = [(k, v) for k, v in record.headers if v is not None]
        cancel = decode_cancel(record.value, h.header(headers, h.CONTENT_TYPE))
        if isinstance(cancel, str):
            self.malformed += 1
            log.warning(
                "cancel_malformed",
                topic=record.topic,
                partition=record.partition,
                offset=record.offset,
                detail=cancel[:200],
            )
            return
        self.received += 1
        log.debug("cancel_received", request_id=cancel.id, reason=cancel.reason)
        await self._hand_on(Cancel(cancel.id, cancel.reason))

    async def _hand_on(self, cancel: Cancel) -> None:
        """To the ingest; waits while its mailbox is full, but never past `stop()` (an ingest
        that has stopped reads no more cancels, and a drain must not hang on one)."""
        if self.cancels.try_send(cancel):
            return
        sending = asyncio.create_task(self.cancels.send(cancel))
        stopping = asyncio.create_task(self.stopping.wait())
        try:
            await asyncio.wait({sending, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            if not sending.done():
                sending.cancel()
                log.warning("cancel_dropped", request_id=cancel.request_id, reason="stopping")

    async def _ready_loop(self, consumer: AIOKafkaConsumer) -> None:
        """Set `ready` whenever a new assignment has every position resolved."""
        await ready_on_each_assignment(
            consumer,
            self._assigned,
            self.ready,
            lambda partitions: log.info("cancel_ready", partitions=partitions),
        )


class _Assigned(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, actor: CancelActor, consumer: AIOKafkaConsumer) -> None:
        self.actor = actor
        self.consumer = consumer

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        self.actor.ready.clear()

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        await self.actor._rewind(self.consumer, assigned)
        self.actor._assigned.set()
