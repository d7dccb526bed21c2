"""Topics a producer does not know yet: a record for one waits on its own, bounded.

aiokafka's `send` first waits for its topic's metadata, for up to its request_timeout_ms
(`--delivery-timeout-ms`, 40 s by default). Awaited in line, one result for a reply topic that
is gone (deleted after its request was admitted) or whose metadata the broker is slow to give
would hold every result behind it. So the emitter and the transaction lanes ask `known()`
first: a record whose topic is known is sent at once; one whose topic is not waits in a task of
its own for `topic_ready()`, at most `--topic-metadata-wait-ms`, and only then is sent (or, when
the wait failed, given the failure its send would have had):

- the broker answered, without the topic: `UnknownTopicOrPartitionError`, a refusal
  (`actors.send_errors`): the result is answered instead (`reply_to_refused`);
- the broker did not answer: `KafkaTimeoutError`, sent again after a backoff, as any send
  to a broker that is away.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError, KafkaTimeoutError, UnknownTopicOrPartitionError

from actors.emit.records import Pending, Record, send

POLL_S = 0.5  # between two questions to the broker while a topic is awaited


def known(producer: AIOKafkaProducer, topic: str) -> bool:
    """Whether `producer` has `topic`'s partitions, so that `send` will not wait for them."""
    # The producer's cluster metadata, read without a request (aiokafka has no public view).
    cluster = cast(Any, producer).client.cluster
    return cluster.partitions_for_topic(topic) is not None


def unknown_topics(producer: AIOKafkaProducer, records: list[Record]) -> set[str]:
    return unknown_topics_of(producer, {r.topic for r in records})


def unknown_topics_of(producer: AIOKafkaProducer, topics: set[str]) -> set[str]:
    return {topic for topic in topics if not known(producer, topic)}


async def topic_ready(producer: AIOKafkaProducer, topic: str, wait_s: float) -> KafkaError | None:
    """Wait up to `wait_s` for `topic` to be on the broker (a topic just made may take a moment
    to reach every broker); None once it is, else the failure its records' sends get."""
    # Asked apart from the producer's own metadata: an update of that makes every produce
    # request wait for it (aiokafka's sender), so asking it again and again (as its
    # `partitions_for` does) would slow every other result.
    if known(producer, topic):
        return None
    client = cast(Any, producer).client
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    answered = False
    while (left := deadline - loop.time()) > 0:
        try:
            cluster = await asyncio.wait_for(client.fetch_all_metadata(), left)
        except (TimeoutError, KafkaError):
            cluster = None
        if cluster is not None:
            answered = True
            if topic in cluster.topics() or topic in cluster.unauthorized_topics:
                return await _learnt(producer, topic, deadline - loop.time())
        await asyncio.sleep(min(POLL_S, max(0.0, deadline - loop.time())))
    if not answered:
        return KafkaTimeoutError(f"no metadata for {topic!r} within {wait_s:g} s")
    return UnknownTopicOrPartitionError(f"{topic!r} is not on the broker")


async def _learnt(producer: AIOKafkaProducer, topic: str, wait_s: float) -> KafkaError | None:
    """The broker has `topic`: the producer's own metadata learns it (one update), so that
    `known()` says so and its send does not wait."""
    try:
        await asyncio.wait_for(producer.partitions_for(topic), max(wait_s, POLL_S))
    except (TimeoutError, KafkaError) as exc:
        return exc if isinstance(exc, KafkaError) else KafkaTimeoutError(repr(exc))
    return None


async def topics_ready(
    producer: AIOKafkaProducer, topics: set[str], wait_s: float
) -> dict[str, KafkaError | None]:
    """`topic_ready` for each of `topics`, waited for together."""
    ordered = sorted(topics)
    failures = await asyncio.gather(*(topic_ready(producer, t, wait_s) for t in ordered))
    return dict(zip(ordered, failures, strict=True))


async def send_or_fail(
    producer: AIOKafkaProducer, record: Record, failure: KafkaError | None
) -> asyncio.Future[object]:
    """`send`, or, when its topic's wait failed, an acknowledgement failed with `failure`."""
    if failure is None:
        return await send(producer, record)
    failed: asyncio.Future[object] = asyncio.get_running_loop().create_future()
    failed.set_exception(failure)
    return failed


async def send_when_known(
    producer: AIOKafkaProducer, record: Record, wait_s: float
) -> asyncio.Future[object]:
    """`send`, having waited at most `wait_s` for the topic's metadata if the producer lacks
    it; a failed wait comes back as a failed acknowledgement (see `topic_ready`)."""
    failure = None
    if not known(producer, record.topic):
        failure = await topic_ready(producer, record.topic, wait_s)
    return await send_or_fail(producer, record, failure)


async def send_apart(producer: AIOKafkaProducer, p: Pending, wait_s: float) -> None:
    """Wait for the topics of `p`'s records and of its chunks not sent yet, then send those
    chunks (a request's chunks precede its result) and its records (`p.acks`)."""
    unsent = [sent for sent in p.chunks if sent.ack is None and not sent.confirmed]
    topics = {sent.record.topic for sent in unsent} | {record.topic for record in p.records}
    failures = await topics_ready(producer, unknown_topics_of(producer, topics), wait_s)
    for sent in unsent:
        sent.ack = await send_or_fail(producer, sent.record, failures.get(sent.record.topic))
    p.acks = [await send_or_fail(producer, r, failures.get(r.topic)) for r in p.records]
