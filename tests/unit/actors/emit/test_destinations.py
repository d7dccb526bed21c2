"""A record for a topic the producer does not know waits for its topic apart, at most the bound,
in the order records came, then is sent or gets the failure its send would have had: a refusal
when the broker says the topic is not there, a retry when the broker did not answer."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from aiokafka.errors import KafkaTimeoutError, UnknownTopicOrPartitionError

from actors.emit.destinations import Destinations, TopicWaits, on_broker
from actors.emit.records import Record, known
from actors.send_errors import Verdict, verdict
from tests.unit.actors.emit.fake_producer import MetadataProducer

FOREVER_S = 3600.0  # a bound no test reaches: what it checks happens without waiting it out


def record(topic: str, value: bytes = b"{}") -> Record:
    return Record(topic, value, b"r-1", [], "result")


def producer(fake: MetadataProducer) -> Any:
    return cast(Any, fake)


def counted() -> tuple[list[str], Any]:
    counts: list[str] = []
    return counts, counts.append


async def test_a_known_topic_is_ready_without_asking_the_broker() -> None:
    fake = MetadataProducer({"lane.results"}, broker=None)  # a broker that would never answer
    assert known(producer(fake), "lane.results")
    assert await on_broker(producer(fake), "lane.results", FOREVER_S) is None


async def test_a_topic_the_broker_does_not_have_is_refused_after_the_bound() -> None:
    fake = MetadataProducer({"lane.results"}, broker={"lane.results"})
    failure = await on_broker(producer(fake), "gone.results", 0.01)
    assert isinstance(failure, UnknownTopicOrPartitionError)
    assert verdict(failure) is Verdict.REFUSED, "answered instead: reply_to_refused"


async def test_a_broker_that_does_not_answer_makes_it_a_retry_not_a_refusal() -> None:
    fake = MetadataProducer({"lane.results"}, broker=None)
    failure = await on_broker(producer(fake), "slow.results", 0.01)
    assert isinstance(failure, KafkaTimeoutError)
    assert verdict(failure) is Verdict.RETRY


async def test_a_topic_on_the_broker_is_learnt_though_the_producer_lacked_it() -> None:
    fake = MetadataProducer(set(), broker={"new.results"})
    assert await on_broker(producer(fake), "new.results", FOREVER_S) is None
    assert known(producer(fake), "new.results")


async def test_every_record_for_a_topic_shares_one_wait() -> None:
    fake = MetadataProducer(set(), broker=set())
    waits = TopicWaits(producer(fake), FOREVER_S)
    first = asyncio.create_task(waits.ready("new.results"))
    second = asyncio.create_task(waits.ready("new.results"))
    await asyncio.sleep(0)
    assert not waits.known("new.results") and len(waits._waits) == 1
    fake.appear("new.results")
    assert await first is None and await second is None
    assert waits.known("new.results")


async def test_a_known_topic_is_sent_at_once_and_an_unknown_one_waits_apart_in_order() -> None:
    fake = MetadataProducer({"lane.results"}, broker=set())
    counts, count = counted()
    out = Destinations(producer(fake), wait_s=FOREVER_S, count=count)
    later = [await out.send(record("new.results", b"chunk")),
             await out.send(record("new.results", b"result"))]  # fmt: skip
    now = await out.send(record("lane.results"))
    assert await now is None and fake.sent == [("lane.results", b"{}", b"r-1")]
    assert all(out.waiting(ack) for ack in later) and not out.waiting(now)
    fake.appear("new.results")
    assert await asyncio.gather(*later) == [None, None]
    assert [value for topic, value, _ in fake.sent if topic == "new.results"] == [
        b"chunk",
        b"result",
    ]
    assert counts == ["topic_awaited", "topic_awaited"]
    # Once known, its next record goes at once.
    assert not out.waiting(await out.send(record("new.results")))


async def test_a_failed_wait_fails_every_record_that_waited_and_sends_none() -> None:
    fake = MetadataProducer({"lane.results"}, broker={"lane.results"})
    out = Destinations(producer(fake), wait_s=0.01, count=lambda _: None)
    acks = [await out.send(record("gone.results")) for _ in range(3)]
    for ack in acks:
        with pytest.raises(UnknownTopicOrPartitionError):
            await ack
    assert fake.sent == []


async def test_close_cancels_what_waits() -> None:
    fake = MetadataProducer(set(), broker=None)
    out = Destinations(producer(fake), wait_s=FOREVER_S, count=lambda _: None)
    ack = await out.send(record("slow.results"))
    out.close()
    assert ack.cancelled()
