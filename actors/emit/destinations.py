"""Topics a producer does not know: a record for one waits on its own, bounded.

aiokafka's `send` first waits for its topic's metadata, for up to its request_timeout_ms
(`--delivery-timeout-ms`, 40 s by default). Awaited in line, one result for a reply topic that
is gone (deleted after its request was admitted) or whose metadata the broker is slow to give
would hold every result behind it. So a record is sent at once only when its producer knows
its topic; otherwise it waits, with the other records for that topic, in the order they came,
for `TopicWaits.ready` (at most `--topic-metadata-wait-ms`), and only then is handed to the
producer, or given the failure its send would have had:

- the broker answered, without the topic: `UnknownTopicOrPartitionError`, a refusal
  (`actors.send_errors`): a result is answered instead (`reply_to_refused`);
- the broker did not answer: `KafkaTimeoutError`, sent again after a backoff, as any send
  to a broker that is away.

The broker is asked apart from the producer's own metadata, one question at a time per topic
however many records wait for it: while aiokafka's producer lacks a topic it asks the broker
again every 100 ms, and its sender waits on those updates before it sends anything more.

    out = Destinations(producer, wait_s=10.0, count=metrics_count)
    ack = await out.send(record)   # never waits for a topic; `ack` settles when the broker does
    out.close()                    # the producer is going: what still waits is cancelled

A producer that already holds a topic's metadata when the topic is deleted is another case:
its records would sit in the producer's queue; every record sent is watched for that
(`actors.emit.vanished`), and those found are failed and sent again, to wait here.
"""

from __future__ import annotations

import asyncio
import collections
import functools
from collections.abc import Callable
from typing import Any, cast

import structlog
from aiokafka import AIOKafkaProducer
from aiokafka.errors import (
    KafkaError,
    KafkaTimeoutError,
    TopicAuthorizationFailedError,
    UnknownTopicOrPartitionError,
)

from actors.emit.records import Record, known, retrieve, send
from actors.emit.vanished import VanishWatch

log = structlog.get_logger("tokenmill.emitter")

FIRST_POLL_S = 0.05  # the second question to the broker; each later one waits twice as long
POLL_S = 0.5  # at most, between two questions to the broker while a topic is awaited


async def on_broker(producer: AIOKafkaProducer, topic: str, wait_s: float) -> KafkaError | None:
    """Wait up to `wait_s` for `topic` to be on the broker and in `producer`'s metadata; None
    once it is, else the failure a send to it gets (see the module's docstring)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    client = cast(Any, producer).client
    answered, pause = False, FIRST_POLL_S
    while not known(producer, topic):
        left = deadline - loop.time()
        if left <= 0:
            if answered:
                return UnknownTopicOrPartitionError(f"{topic!r} is not on the broker")
            return KafkaTimeoutError(f"no metadata for {topic!r} within {wait_s:g} s")
        try:
            cluster = await asyncio.wait_for(client.fetch_all_metadata(), left)
        except (TimeoutError, KafkaError):
            cluster = None
        if cluster is not None:
            answered = True
            if topic in cluster.unauthorized_topics:
                return TopicAuthorizationFailedError(topic)
            if topic in cluster.topics():
                return await _learnt(producer, topic, max(deadline - loop.time(), POLL_S))
        await asyncio.sleep(max(0.0, min(pause, deadline - loop.time())))
        pause = min(2 * pause, POLL_S)
    return None


async def _learnt(producer: AIOKafkaProducer, topic: str, wait_s: float) -> KafkaError | None:
    """The broker has `topic`: `producer`'s own metadata learns it (one update)."""
    try:
        await asyncio.wait_for(producer.partitions_for(topic), wait_s)
    except KafkaError as exc:
        return exc
    except TimeoutError:
        return KafkaTimeoutError(f"no metadata for {topic!r} within {wait_s:g} s")
    return None


class TopicWaits:
    """`on_broker` for one producer, one wait per topic shared by all who ask meanwhile."""

    def __init__(self, producer: AIOKafkaProducer, wait_s: float) -> None:
        self.producer = producer
        self.wait_s = wait_s
        self._waits: dict[str, asyncio.Task[KafkaError | None]] = {}

    def known(self, topic: str) -> bool:
        return topic not in self._waits and known(self.producer, topic)

    async def ready(self, topic: str) -> KafkaError | None:
        """None once `producer` knows `topic`; the failure its sends get if not in time."""
        wait = self._waits.get(topic)
        if wait is None:
            log.info("topic_awaited", topic=topic, wait_s=self.wait_s)
            wait = asyncio.create_task(on_broker(self.producer, topic, self.wait_s))
            self._waits[topic] = wait
            wait.add_done_callback(lambda _: self._waits.pop(topic, None))
        return await asyncio.shield(wait)

    def close(self) -> None:
        for wait in list(self._waits.values()):
            wait.cancel()
        self._waits.clear()


class Destinations:
    """Hands records to one producer; those for a topic it does not know wait apart, in order.

    `count("topic_awaited")` is told of each record that waited for its topic."""

    def __init__(
        self, producer: AIOKafkaProducer, *, wait_s: float, count: Callable[[str], None]
    ) -> None:
        self.producer = producer
        self.topics = TopicWaits(producer, wait_s)
        self.vanished = VanishWatch(producer, count=count)
        self.count = count
        # Per awaited topic, its records in the order they came, each with what its sender holds.
        self._queues: dict[str, collections.deque[tuple[Record, asyncio.Future[object]]]] = {}
        self._drains: set[asyncio.Task[None]] = set()
        self._deferred: set[asyncio.Future[object]] = set()  # not handed to the producer yet

    async def send(self, record: Record) -> asyncio.Future[object]:
        """The acknowledgement of `record`; never waits for its topic (see the module)."""
        queue = self._queues.get(record.topic)
        if queue is None and known(self.producer, record.topic):
            return await self._send(record)
        deferred: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        deferred.add_done_callback(retrieve)
        self._deferred.add(deferred)
        deferred.add_done_callback(self._deferred.discard)
        self.count("topic_awaited")
        if queue is None:
            queue = self._queues[record.topic] = collections.deque()
            drain = asyncio.create_task(self._drain(record.topic, queue))
            self._drains.add(drain)
            drain.add_done_callback(self._drains.discard)
        queue.append((record, deferred))
        return deferred

    def waiting(self, ack: asyncio.Future[object]) -> bool:
        """Whether `ack` is of a record that waits (or waited) for its topic, not settled yet."""
        return ack in self._deferred

    def close(self) -> None:
        """The producer is going: what still waits is cancelled (its outcomes are sent again
        by the next producer, from the emitter's backlog)."""
        for drain in list(self._drains):
            drain.cancel()
        self.topics.close()
        self.vanished.close()
        for queue in self._queues.values():
            for _, deferred in queue:
                deferred.cancel()
        self._queues.clear()

    async def _drain(
        self, topic: str, queue: collections.deque[tuple[Record, asyncio.Future[object]]]
    ) -> None:
        failure = await self.topics.ready(topic)
        if failure is not None:
            log.warning("topic_not_ready", topic=topic, error=repr(failure), records=len(queue))
        while queue:  # those that come while one is handed over wait behind it
            record, deferred = queue[0]
            if failure is None:
                ack = await self._send(record)
                ack.add_done_callback(functools.partial(_settle, deferred))
            else:
                deferred.set_exception(failure)
            queue.popleft()
        self._queues.pop(topic, None)

    async def _send(self, record: Record) -> asyncio.Future[object]:
        return self.vanished.track(record.topic, await send(self.producer, record))


def _settle(deferred: asyncio.Future[object], ack: asyncio.Future[object]) -> None:
    if deferred.done():
        return
    if ack.cancelled():
        deferred.cancel()
    elif (exc := ack.exception()) is not None:
        deferred.set_exception(exc)
    else:
        deferred.set_result(ack.result())
