"""Topics deleted while a producer still holds their metadata: their records are found and
failed, so that they wait apart like any record for a topic the producer does not know.

aiokafka sends a record for a topic it knows at once. When that topic has been deleted since,
the record stays in the producer: an idempotent producer sends it again until the partition's
leader is gone from its metadata and the batch expires (`--delivery-timeout-ms`); a
transactional one asks, again and again, for the partition to be added to its transaction, and
that holds every other record of the transaction too (the lane stalls). So a producer's
unsettled acknowledgements are watched:

    watch = VanishWatch(producer, count=metrics_count)
    ack = watch.track(record.topic, await send(producer, record))
    watch.close()                  # the producer is going

While any is unsettled, every POLL_S the producer's metadata is read; once one is older than
STALE_S the broker is asked whether its topic is still there (one question per poll). A topic
gone is evicted: the producer's queued batches for it fail with `TopicVanished` (retriable),
and its transaction stops waiting to add the topic's partitions. Sent again, the records find
their topic unknown and wait apart (`actors.emit.destinations`), bounded, then are refused
(a result is answered instead: reply_to_refused).

aiokafka has no public API for this: `evict` reaches into its accumulator and transaction
manager (aiokafka 0.14; the unit tests run it on those very classes).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any, cast

import structlog
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from actors.emit.records import known

log = structlog.get_logger("tokenmill.emitter")

POLL_S = 0.25  # between two looks at the unsettled acknowledgements
STALE_S = 0.5  # an acknowledgement unsettled this long has its topic looked up on the broker
ASK_S = 1.0  # at most, for the broker's answer (none: nothing is evicted this time)


class TopicVanished(KafkaError):  # type: ignore[misc]
    """The record's topic was deleted while the producer held it: sent again, it waits apart."""

    errno = -1
    message = "TOPIC_VANISHED"
    description = "the topic was deleted while the producer still held records for it"
    retriable = True


def evict(producer: AIOKafkaProducer, topic: str, failure: KafkaError) -> int:
    """Fail every batch `producer` still queues for `topic` with `failure`, and stop its
    transaction waiting to add `topic`'s partitions; return how many batches failed.

    A batch in flight (sent, unanswered) is left: the broker's answer sends it back to the
    queue, and the next eviction takes it."""
    inner = cast(Any, producer)
    accumulator = inner._message_accumulator
    evicted = 0
    for tp in [tp for tp in accumulator._batches if tp.topic == topic]:
        for batch in accumulator._batches.pop(tp):
            if batch.retry_count:
                # Sent once and queued again: the callback it got when first sent takes it
                # out of the in-flight set when it settles, so it must be in that set.
                accumulator._pending_batches.add(batch)
            drained = batch._drain_waiter  # awaited only by a sender finding the batch full
            batch.failure(exception=failure)
            if drained.done():
                drained.exception()  # read here, or asyncio warns that nobody did
            evicted += 1
    manager = inner._txn_manager
    if manager is not None:
        adding = manager._pending_txn_partitions
        for tp in [tp for tp in adding if tp.topic == topic]:
            adding.discard(tp)
    return evicted


class VanishWatch:
    """Watches one producer's unsettled acknowledgements for topics deleted meanwhile (see the
    module). `count("topic_vanished")` is told of each topic evicted."""

    def __init__(
        self, producer: AIOKafkaProducer, *, count: Callable[[str], None] | None = None
    ) -> None:
        self.producer = producer
        self.count = count
        self._acks: dict[asyncio.Future[object], tuple[str, float]] = {}  # -> (topic, sent at)
        self._watch: asyncio.Task[None] | None = None

    def track(self, topic: str, ack: asyncio.Future[object]) -> asyncio.Future[object]:
        """Watch `ack`, of a record for `topic`, until it settles; return it."""
        if ack.done():
            return ack
        loop = asyncio.get_running_loop()
        self._acks[ack] = (topic, loop.time())
        ack.add_done_callback(self._settled)
        if self._watch is None or self._watch.done():
            self._watch = asyncio.create_task(self._run())
        return ack

    def close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
        self._acks.clear()

    def _settled(self, ack: asyncio.Future[object]) -> None:
        self._acks.pop(ack, None)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while self._acks:
            await asyncio.sleep(POLL_S)
            now = loop.time()
            watched = list(self._acks.values())
            gone = {topic for topic, _ in watched if not known(self.producer, topic)}
            old = {topic for topic, sent in watched if now - sent > STALE_S} - gone
            if old:
                gone |= await self._off_broker(old)
            for topic in sorted(gone):
                batches = evict(self.producer, topic, TopicVanished(topic))
                log.warning("topic_vanished", topic=topic, batches=batches)
                if self.count is not None:
                    self.count("topic_vanished")

    async def _off_broker(self, topics: set[str]) -> set[str]:
        """Those of `topics` the broker says it does not have; the producer's metadata is
        brought up to date before this returns, so that their records, sent again, wait apart.
        None of them when the broker does not answer (a broker away is not a topic gone)."""
        client = cast(Any, self.producer).client
        try:
            cluster = await asyncio.wait_for(client.fetch_all_metadata(), ASK_S)
        except (TimeoutError, KafkaError):
            return set()
        on_broker = cluster.topics() | cluster.unauthorized_topics
        gone = {topic for topic in topics if topic not in on_broker}
        if gone:
            # If it does not come, their records are evicted again at the next look.
            with contextlib.suppress(TimeoutError, KafkaError):
                await asyncio.wait_for(client.force_metadata_update(), ASK_S)
        return gone
