"""A record for a topic the producer does not know waits for its metadata at most the bound,
then gets the failure its send would have had: a refusal when the broker says the topic is not
there, a retry when the broker did not answer."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from aiokafka.errors import KafkaTimeoutError, UnknownTopicOrPartitionError

from actors.emit.destinations import known, send_apart, topic_ready, unknown_topics
from actors.emit.records import Pending, Record, RecordKind, SentChunk
from actors.mail import Outcome, RecordRef
from actors.send_errors import Verdict, verdict
from actors.telemetry.tracing import RequestSpans
from messages.codec import JSON
from messages.result import GenerateResult
from tests.unit.actors.emit.fake_producer import MetadataProducer

FOREVER_S = 3600.0  # a bound no test reaches: what it checks happens without waiting it out


def record(topic: str, *, kind: RecordKind = "result") -> Record:
    return Record(topic, b"{}", b"r-1", [], kind)


def producer(fake: MetadataProducer) -> Any:
    return cast(Any, fake)


async def test_a_known_topic_is_ready_without_asking_the_broker() -> None:
    fake = MetadataProducer({"lane.results"}, broker=None)  # a broker that would never answer
    assert known(producer(fake), "lane.results")
    assert await topic_ready(producer(fake), "lane.results", FOREVER_S) is None


async def test_a_topic_the_broker_does_not_have_is_refused_after_the_bound() -> None:
    fake = MetadataProducer({"lane.results"}, broker={"lane.results"})
    failure = await topic_ready(producer(fake), "gone.results", 0.01)
    assert isinstance(failure, UnknownTopicOrPartitionError)
    assert verdict(failure) is Verdict.REFUSED, "answered instead: reply_to_refused"


async def test_a_broker_that_does_not_answer_makes_it_a_retry_not_a_refusal() -> None:
    fake = MetadataProducer({"lane.results"}, broker=None)
    failure = await topic_ready(producer(fake), "slow.results", 0.01)
    assert isinstance(failure, KafkaTimeoutError)
    assert verdict(failure) is Verdict.RETRY


async def test_a_topic_that_appears_within_the_bound_is_ready() -> None:
    fake = MetadataProducer(set(), broker=set())
    waiting = asyncio.create_task(topic_ready(producer(fake), "new.results", FOREVER_S))
    await asyncio.sleep(0)
    assert not waiting.done()
    fake.appear("new.results")
    assert await waiting is None


async def test_a_topic_on_the_broker_is_ready_though_the_producer_has_not_its_metadata() -> None:
    fake = MetadataProducer(set(), broker={"new.results"})
    assert await topic_ready(producer(fake), "new.results", 0.01) is None


def test_unknown_topics_are_those_the_producer_lacks() -> None:
    fake = MetadataProducer({"lane.results", "lane.dlq"})
    records = [record("gone.results"), record("lane.dlq", kind="dead_letter")]
    assert unknown_topics(producer(fake), records) == {"gone.results"}


async def test_apart_the_chunks_go_first_and_a_failed_wait_fails_every_acknowledgement() -> None:
    fake = MetadataProducer({"lane.dlq"}, broker={"lane.dlq"})
    outcome = Outcome(RecordRef("lane.requests", 0, 1, 0), GenerateResult(id="r-1"),
                      "gone.results", JSON)  # fmt: skip
    p = Pending(outcome, RequestSpans([], []), [record("gone.results")], [])
    p.records.append(record("lane.dlq", kind="dead_letter"))
    p.chunks = [SentChunk(record("gone.results", kind="chunk"))]
    await send_apart(producer(fake), p, 0.01)
    chunk_ack = p.chunks[0].ack
    assert chunk_ack is not None
    for ack in (chunk_ack, p.acks[0]):
        with pytest.raises(UnknownTopicOrPartitionError):
            await ack
    assert await p.acks[1] is None
    assert fake.sent == [("lane.dlq", b"{}", b"r-1")], "only the dead letter's topic is there"


async def test_apart_once_the_topic_appears_the_chunks_precede_the_result() -> None:
    fake = MetadataProducer(set(), broker=set())
    outcome = Outcome(RecordRef("lane.requests", 0, 1, 0), GenerateResult(id="r-1"),
                      "new.results", JSON)  # fmt: skip
    p = Pending(
        outcome, RequestSpans([], []), [Record("new.results", b"result", b"r-1", [], True)], []
    )
    p.chunks = [SentChunk(Record("new.results", b"chunk", b"r-1", [], False))]
    sending = asyncio.create_task(send_apart(producer(fake), p, FOREVER_S))
    await asyncio.sleep(0)
    fake.appear("new.results")
    await sending
    assert [value for _, value, _ in fake.sent] == [b"chunk", b"result"]
