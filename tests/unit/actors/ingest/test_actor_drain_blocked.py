"""A drain does not wait for outcomes the emitter holds back (`OutcomeBlocked`: a dead letter
the DLQ refuses): the ingest commits up to the first blocked offset, not past it, says so
(`offset_left_uncommitted`) and stops. A fake consumer stands in for the broker; the test
plays the emitter (it reads the outcomes and answers with the emitter's notices)."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from aiokafka.structs import ConsumerRecord, TopicPartition
from structlog.testing import capture_logs

from actors.config import WorkerConfig
from actors.ingest.actor import IngestActor
from actors.ingest.crash_guard import RELEASED
from actors.ingest.model_front import ModelFront, TokenizerLike
from actors.mail import Batch, Cancel, Delivered, Outcome, OutcomeBlocked
from actors.runtime import Mailbox
from tests.unit.actors.kafka.fake_consumer import FakeConsumer

TP = TopicPartition("lane.requests", 0)
WITHIN_S = 60  # only to catch a hang: every wait ends on an event


def undecodable(offset: int) -> ConsumerRecord[bytes, bytes]:
    return ConsumerRecord(
        topic=TP.topic, partition=TP.partition, offset=offset, timestamp=0, timestamp_type=0,
        key=None, value=b"{x", checksum=None, serialized_key_size=-1, serialized_value_size=2,
        headers=[],
    )  # fmt: skip


def ingest_over(consumer: FakeConsumer) -> tuple[IngestActor, Mailbox[Outcome]]:
    config = WorkerConfig(
        requests_topic=TP.topic, results_topic="lane.results", dlq_topic="lane.dlq"
    )
    front = ModelFront(
        name="m",
        digest="d",
        aliases=frozenset({"m"}),
        tokenizer=cast(TokenizerLike, None),
        vocab_size=8,
        max_model_len=64,
        max_prompt_tokens=32,
        max_new_tokens=16,
    )  # fmt: skip: no record here reaches the tokenizer
    outcomes: Mailbox[Outcome] = Mailbox(64)
    batches: Mailbox[Batch | Cancel] = Mailbox(64)
    ingest = IngestActor(
        config, front, batches=batches, outcomes=outcomes, consumer=lambda: cast(Any, consumer)
    )
    return ingest, outcomes


async def test_a_drain_commits_up_to_a_blocked_dead_letter_and_stops() -> None:
    consumer = FakeConsumer([TP], [undecodable(offset) for offset in range(3)])
    ingest, outcomes = ingest_over(consumer)
    with capture_logs() as logs:
        async with asyncio.timeout(WITHIN_S):
            running = asyncio.create_task(ingest.run())
            first, second, third = [await outcomes.get() for _ in range(3)]
            assert all(o.dead_letter is not None for o in (first, second, third))
            ingest.stop()  # the drain begins with all three in flight
            for notice in (
                Delivered(first.record, admitted=False, cost_tokens=0),
                OutcomeBlocked(second.record),
                Delivered(third.record, admitted=False, cost_tokens=0),
            ):
                await ingest.mailbox.send(notice)
            await running
    assert consumer.commits[-1] == {TP: (1, RELEASED)}, "up to the blocked offset, not past"
    (left,) = [e for e in logs if e["event"] == "offset_left_uncommitted"]
    assert (left["topic"], left["partition"], left["offset"], left["blocked"]) == (
        TP.topic, 0, 1, 1,
    )  # fmt: skip


async def test_a_blocked_outcome_delivered_before_the_drain_ends_is_committed_past() -> None:
    consumer = FakeConsumer([TP], [undecodable(offset) for offset in range(2)])
    ingest, outcomes = ingest_over(consumer)
    with capture_logs() as logs:
        async with asyncio.timeout(WITHIN_S):
            running = asyncio.create_task(ingest.run())
            first, second = [await outcomes.get() for _ in range(2)]
            for notice in (
                OutcomeBlocked(first.record),
                Delivered(second.record, admitted=False, cost_tokens=0),
                Delivered(first.record, admitted=False, cost_tokens=0),  # the DLQ took it
            ):
                await ingest.mailbox.send(notice)
            ingest.stop()
            await running
    assert consumer.commits[-1] == {TP: (2, RELEASED)}
    assert "offset_left_uncommitted" not in [e["event"] for e in logs]
