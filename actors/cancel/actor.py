"""CancelActor: `CancelRequest`s in from the cancel topic, `Cancel`s out to the ingest.

Reads the cancel topic in a consumer group of its own (`<group>.cancel.<worker id>`), so every
worker sees every cancel, whichever worker holds the request. It never commits: on each
assignment it starts from the cancels of the last `REMEMBER_S` seconds (the offsets for that
time), the window the ingest remembers cancelled ids for, so a worker started (or restarted)
after a cancel still answers its request cancelled when it arrives. A record that is not a
cancel a worker holds is refused, counted by reason (`refused`) and logged, never a crash: one
that does not decode (`cancel_malformed`), one over `MAX_CANCEL_BYTES` (not decoded) or whose
id is longer than a request id can be (`cancel_refused`), one the Kafka client could not read
as sent (a header key that is not UTF-8, a damaged batch: `cancel_unreadable`, see
`actors.kafka.record_reader`). A fetch that still raises on its records is logged
(`cancel_fetch_failed`) and tried again after a pause. A cancel topic that does
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
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import msgspec
import structlog
from aiokafka.structs import ConsumerRecord, TopicPartition

from actors.cancel.remembered import REMEMBER_S
from actors.config import WorkerConfig
from actors.kafka import record_reader
from actors.kafka.consumers import cancel_consumer
from actors.kafka.partition_reader import Consumer, PartitionReader
from actors.mail import Cancel
from actors.runtime import Actor, Address
from messages import headers as h
from messages.cancel import MAX_CANCEL_BYTES, CancelRequest, cancel_codec
from messages.codec import normalize_content_type
from messages.errors import UnsupportedContentType
from messages.limits import MAX_ID_BYTES

log = structlog.get_logger("tokenmill.cancel")

TOPIC_RECHECK_S = 10.0


RefusalReason = Literal["malformed", "too_large", "id_too_long", "unreadable"]


@dataclass(frozen=True, slots=True)
class Refused:
    """Why a cancel record is not acted on: `reason` for counters, `detail` for the log."""

    reason: RefusalReason
    detail: str


def decode_cancel(value: bytes | None, content_type: bytes | None) -> CancelRequest | Refused:
    """The cancel in a record's value, or why it is not one. A value over `MAX_CANCEL_BYTES`
    is not decoded at all."""
    size = len(value or b"")
    if size > MAX_CANCEL_BYTES:
        return Refused("too_large", f"the record is {size} bytes; a cancel is at most "
                       f"{MAX_CANCEL_BYTES}")  # fmt: skip
    try:
        cancel = cancel_codec.decode(value or b"", normalize_content_type(content_type))
    except (msgspec.DecodeError, RecursionError, UnsupportedContentType) as exc:
        return Refused("malformed", str(exc))
    if not cancel.id:
        return Refused("malformed", "a cancel needs the id of the request to cancel")
    id_bytes = len(cancel.id.encode(errors="surrogatepass"))
    if id_bytes > MAX_ID_BYTES:
        return Refused("id_too_long", f"the id is {id_bytes} bytes of UTF-8; a request id is "
                       f"at most {MAX_ID_BYTES}, so no request has it")  # fmt: skip
    return cancel


class CancelActor(Actor[None]):
    def __init__(
        self,
        config: WorkerConfig,
        cancels: Address[Cancel],
        *,
        consumer: Callable[[], Consumer] | None = None,
    ) -> None:
        """`cancels`: the ingest's mailbox; `consumer`: makes the consumer (default: the cancel
        topic's, `actors.kafka.consumers`)."""
        super().__init__("cancel", 1)
        if config.cancel_topic is None:
            raise ValueError("a CancelActor needs config.cancel_topic")
        self.config = config
        self.topic: str = config.cancel_topic
        self.cancels = cancels
        self.ready = asyncio.Event()
        self.received = 0
        self.refused: Counter[str] = Counter()  # records not acted on, by `Refused.reason`
        self.make_consumer = consumer or (lambda: cancel_consumer(config))
        self.clock = time.time
        self.topic_recheck_s = TOPIC_RECHECK_S

    @property
    def malformed(self) -> int:
        """Records refused, whatever the reason."""
        return self.refused.total()

    @property
    def listening(self) -> bool:
        """Assigned the cancel topic with its positions resolved (for readiness)."""
        return self.ready.is_set()

    async def _topic_found(self, consumer: Consumer) -> bool:
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

    async def _rewind(self, consumer: Consumer, assigned: set[TopicPartition]) -> None:
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
        reader = PartitionReader(
            self.make_consumer,
            name="cancel",
            settings=self.config,
            stopping=self.stopping,
            partitions=self,
            failed_event="cancel_fetch_failed",
            ready=self.ready,
        )
        if (consumer := await reader.open()) is None:
            return
        try:
            if not await self._topic_found(consumer):
                return
            reader.subscribe(self.topic)
            log.info("cancel_started", topic=self.topic)
            async with asyncio.TaskGroup() as tg:
                positions = tg.create_task(
                    reader.keep_ready(lambda n: log.info("cancel_ready", partitions=n))
                )
                async for record in reader.records():
                    await self._handle(record)
                positions.cancel()
        finally:
            await reader.close()
            log.info("cancel_stopped", received=self.received, refused=dict(self.refused))

    async def assigned(self, consumer: Consumer, assigned: set[TopicPartition]) -> None:
        await self._rewind(consumer, assigned)

    async def revoked(self, consumer: Consumer, revoked: set[TopicPartition]) -> None:
        pass  # the reader clears `ready`

    async def _handle(self, record: ConsumerRecord[bytes, bytes]) -> None:
        cancel = _read(record)
        if isinstance(cancel, Refused):
            self.refused[cancel.reason] += 1
            log.warning(
                _REFUSAL_EVENTS.get(cancel.reason, "cancel_refused"),
                topic=record.topic,
                partition=record.partition,
                offset=record.offset,
                reason=cancel.reason,
                detail=cancel.detail[:200],
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


_REFUSAL_EVENTS = {"malformed": "cancel_malformed", "unreadable": "cancel_unreadable"}


def _read(record: ConsumerRecord[bytes, bytes]) -> CancelRequest | Refused:
    """The cancel in `record`, or why it is not acted on."""
    if (reason := record_reader.unreadable(record)) is not None:
        return Refused("unreadable", reason)
    headers = record_reader.readable_headers(record.headers)
    return decode_cancel(record.value, h.header(headers, h.CONTENT_TYPE))
