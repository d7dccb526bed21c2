"""IngestActor driven by a fake consumer (no broker): records in → batches and refusals out;
the emitter's notices → commits; cancels; backpressure; a record's headers read once. The test
plays the GPU actor and the emitter (it reads their mailboxes and answers with notices)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, cast

import pytest
from aiokafka.structs import TopicPartition

from actors.config import WorkerConfig
from actors.ingest.actor import IngestActor
from actors.ingest.backpressure import Watermarks
from actors.ingest.crash_guard import RELEASED
from actors.ingest.model_front import ModelFront, TokenizerLike
from actors.kafka import record_reader
from actors.mail import Batch, Cancel, Delivered, Outcome
from actors.runtime import Mailbox
from messages import headers as h
from messages.codec import JSON, Codec
from messages.error_codes import ErrorCode
from messages.request import GenerateRequest
from messages.result import FinishReason
from tests.unit.actors.kafka.fake_consumer import FakeConsumer, record

TP = TopicPartition("lane.requests", 0)
WITHIN_S = 60  # only to catch a hang: every wait ends on an event
TRACEPARENT = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
codec = Codec(GenerateRequest)


def request_record(offset: int, request_id: str, headers: list[Any] | None = None) -> Any:
    request = GenerateRequest(id=request_id, prompt_token_ids=[3, 4, 5], max_new_tokens=2)
    return record(TP, offset, codec.encode(request), headers or [])


@dataclass
class Lane:
    ingest: IngestActor
    consumer: FakeConsumer
    batches: Mailbox[Batch | Cancel]
    outcomes: Mailbox[Outcome]

    async def batch(self) -> Batch:
        mail = await self.batches.get()
        assert isinstance(mail, Batch), mail
        return mail

    async def deliver(self, *refs: Any, admitted: bool = False, cost: int = 0) -> None:
        for ref in refs:
            await self.ingest.mailbox.send(Delivered(ref, admitted=admitted, cost_tokens=cost))

    async def committed(self, offset: int) -> None:
        while self.consumer.committed.get(TP, (-1, ""))[0] < offset:
            await self.consumer.committed_event.wait()
            self.consumer.committed_event.clear()


@asynccontextmanager
async def running(records: list[Any], **settings: Any) -> AsyncIterator[Lane]:
    config = WorkerConfig(
        requests_topic=TP.topic, results_topic="lane.results", dlq_topic="lane.dlq", **settings
    )
    front = ModelFront(
        name="m",
        digest="d",
        aliases=frozenset({"m"}),
        tokenizer=cast(TokenizerLike, None),
        vocab_size=64,
        max_model_len=64,
        max_prompt_tokens=32,
        max_new_tokens=16,
    )  # fmt: skip: prompts here are token ids, never text
    consumer = FakeConsumer([TP], records)
    batches: Mailbox[Batch | Cancel] = Mailbox(64)
    outcomes: Mailbox[Outcome] = Mailbox(64)
    ingest = IngestActor(
        config, front, batches=batches, outcomes=outcomes, consumer=lambda: cast(Any, consumer)
    )
    async with asyncio.timeout(WITHIN_S):
        task = asyncio.create_task(ingest.run())
        try:
            yield Lane(ingest, consumer, batches, outcomes)
        finally:
            ingest.stop()
            await task


async def test_a_request_record_becomes_a_batch_with_its_headers_read_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reads = 0
    readable = record_reader.readable_headers

    def counted(headers: Any) -> list[tuple[str, bytes]]:
        nonlocal reads
        reads += 1
        return readable(headers)

    monkeypatch.setattr(record_reader, "readable_headers", counted)
    headers = [(h.TRACEPARENT, TRACEPARENT), (h.CONTENT_TYPE, JSON.encode())]
    async with running([request_record(0, "a", headers)]) as lane:
        batch = await lane.batch()
        (item,) = batch.items
        assert (item.request.id, item.prompt_token_ids, batch.reason) == ("a", [3, 4, 5], "idle")
        assert (item.record.topic, item.record.partition, item.record.offset) == (TP.topic, 0, 0)
        assert item.trace.headers == [(h.TRACEPARENT, TRACEPARENT)]
        assert (item.content_type, item.reply_topic) == (JSON, "lane.results")
        assert lane.ingest.records_read == 1 and lane.ingest.outstanding == 1
        await lane.deliver(item.record, admitted=True, cost=item.cost_tokens)
    assert reads == 1, "the door reads a record's headers once"
    assert lane.consumer.commits[-1] == {TP: (1, RELEASED)}


async def test_an_undecodable_record_is_refused_with_a_dead_letter_and_committed() -> None:
    async with running([record(TP, 0, b"{not json")], commit_interval_s=0.01) as lane:
        outcome = await lane.outcomes.get()
        assert outcome.result.error is not None
        assert outcome.result.error.code == ErrorCode.INVALID_JSON
        assert outcome.dead_letter is not None and outcome.dead_letter.value == b"{not json"
        assert outcome.reply_topic == "lane.results" and lane.batches.empty()
        await lane.deliver(outcome.record)
        await lane.committed(1)  # by the commit loop, before any drain


async def test_a_request_that_breaks_a_rule_is_refused_without_a_dead_letter() -> None:
    bad = GenerateRequest(id="big", prompt_token_ids=[3] * 40, max_new_tokens=2)
    async with running([record(TP, 0, codec.encode(bad))]) as lane:
        outcome = await lane.outcomes.get()
        assert outcome.result.id == "big" and outcome.result.error is not None
        assert outcome.dead_letter is None
        await lane.deliver(outcome.record)


async def test_a_request_whose_cancel_came_first_is_answered_cancelled_on_arrival() -> None:
    async with running([]) as lane:
        await lane.ingest.cancels.send(Cancel("late", reason="user"))
        passed = await lane.batches.get()
        assert passed == Cancel("late", reason="user"), "passed on: no bucket held it"
        lane.consumer.feed(request_record(0, "late"))
        outcome = await lane.outcomes.get()
        assert outcome.result.finish_reason == FinishReason.CANCELLED
        assert outcome.cancelled_in == "arrival" and lane.batches.empty()
        await lane.deliver(outcome.record, admitted=True, cost=outcome.cost_tokens)


async def test_past_the_high_watermark_the_partitions_pause_and_resume_once_delivered() -> None:
    watermarks = Watermarks(high_requests=1, low_requests=0)  # two pass it
    records = [request_record(i, f"r{i}") for i in range(2)]
    async with running(records, watermarks=watermarks) as lane:
        items: list[Any] = []
        while len(items) < 2:
            items.extend((await lane.batch()).items)
        assert lane.consumer.paused() == {TP} and lane.ingest.paused_partitions == 1
        for item in items:
            await lane.deliver(item.record, admitted=True, cost=item.cost_tokens)
        await lane.committed(2)
        assert lane.consumer.paused() == set()
