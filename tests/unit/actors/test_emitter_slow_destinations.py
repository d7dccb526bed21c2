"""A result for a topic the producer does not know waits on its own, bounded: the outcomes
behind it are produced and delivered meanwhile; after the bound a topic the broker does not
have is answered instead (`reply_to_refused` on the results topic, the request to the DLQ).
So does one for a topic deleted while the producer still knew it, once that is found."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from actors.config import WorkerConfig
from actors.emit import vanished
from actors.emitter import EmitterActor
from actors.mail import Delivered, Outcome, OutcomeBlocked, OutcomeWaiting, RecordRef
from actors.runtime import Mailbox
from messages.codec import JSON, Codec
from messages.error_codes import ErrorCode
from messages.request import GenerateRequest
from messages.result import GenerateResult
from tests.unit.actors.emit.fake_producer import MetadataProducer

RESULTS, DLQ, GONE = "lane.results", "lane.dlq", "gone.results"
FOREVER_MS = 3_600_000.0  # a bound no test reaches


def outcome(offset: int, reply_topic: str = RESULTS) -> Outcome:
    request = GenerateRequest(id=f"r-{offset}", prompt="hi", reply_to=reply_topic)
    return Outcome(RecordRef("lane.requests", 0, offset, 0), GenerateResult(id=f"r-{offset}"),
                   reply_topic, JSON, request=request)  # fmt: skip


def emitter(
    fake: MetadataProducer, wait_ms: float
) -> tuple[EmitterActor, Mailbox[Delivered | OutcomeBlocked | OutcomeWaiting]]:
    config = WorkerConfig(results_topic=RESULTS, dlq_topic=DLQ, topic_metadata_wait_ms=wait_ms)
    delivered: Mailbox[Delivered | OutcomeBlocked | OutcomeWaiting] = Mailbox(64)
    actor = EmitterActor(config, delivered=delivered)
    actor._new_producer = lambda: fake  # type: ignore[method-assign,assignment,return-value]
    actor._dlq_checked = True  # the start-up check has its own tests
    return actor, delivered


async def delivered_offsets(
    mailbox: Mailbox[Any], n: int, waiting: list[int] | None = None
) -> list[int]:
    """The offsets of the next `n` outcomes delivered; those said to wait go to `waiting`."""
    out = []
    async with asyncio.timeout(10):
        while len(out) < n:
            notice = await mailbox.get()
            if isinstance(notice, OutcomeWaiting) and waiting is not None:
                waiting.append(notice.record.offset)
                continue
            assert isinstance(notice, Delivered)
            out.append(notice.record.offset)
    return out


async def test_results_behind_one_for_an_unknown_topic_are_delivered_while_it_waits() -> None:
    fake = MetadataProducer({RESULTS, DLQ}, broker={RESULTS, DLQ})
    actor, delivered = emitter(fake, FOREVER_MS)
    task = asyncio.create_task(actor.run())
    await actor.send(outcome(1, reply_topic=GONE))
    for offset in (2, 3, 4):
        await actor.send(outcome(offset))
    waiting: list[int] = []
    assert sorted(await delivered_offsets(delivered, 3, waiting)) == [2, 3, 4]
    assert [t for t, _, _ in fake.sent] == [RESULTS] * 3
    fake.appear(GONE)  # its metadata comes: it is sent too
    assert await delivered_offsets(delivered, 1, waiting) == [1]
    assert waiting == [1], "the ingest was told it no longer runs"
    assert fake.sent[-1][0] == GONE
    actor.stop()
    await task


async def test_a_topic_gone_from_the_broker_is_answered_instead_after_the_bound() -> None:
    fake = MetadataProducer({RESULTS, DLQ}, broker={RESULTS, DLQ})
    actor, delivered = emitter(fake, 10.0)
    task = asyncio.create_task(actor.run())
    await actor.send(outcome(1, reply_topic=GONE))
    await actor.send(outcome(2))
    assert sorted(await delivered_offsets(delivered, 2, [])) == [1, 2]
    actor.stop()
    await task
    assert actor.answered_instead == 1
    assert GONE not in [topic for topic, _, _ in fake.sent]
    answers = [Codec(GenerateResult).decode(v, JSON) for t, v, _ in fake.sent if t == RESULTS]
    refused = [r for r in answers if r.id == "r-1"]
    assert len(refused) == 1 and refused[0].error is not None
    assert refused[0].error.code == ErrorCode.REPLY_TO_REFUSED
    assert [key for topic, _, key in fake.sent if topic == DLQ] != [], "the request to the DLQ"


async def test_a_topic_deleted_while_the_producer_knew_it_waits_apart_once_found(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(vanished, "POLL_S", 0.01)
    monkeypatch.setattr(vanished, "STALE_S", 0.02)
    fake = MetadataProducer({RESULTS, DLQ, GONE}, broker={RESULTS, DLQ},
                            deleted=frozenset({GONE}))  # fmt: skip
    actor, delivered = emitter(fake, FOREVER_MS)
    task = asyncio.create_task(actor.run())
    for message in (outcome(1, reply_topic=GONE), outcome(2), outcome(3)):
        await actor.send(message)  # before the actor runs: one batch, 1 settled first
    waiting: list[int] = []
    assert sorted(await delivered_offsets(delivered, 2, waiting)) == [2, 3]
    fake.appear(GONE)
    assert await delivered_offsets(delivered, 1, waiting) == [1]
    assert waiting == [1], "the ingest was told it no longer runs"
    assert fake.sent[-1][0] == GONE, "sent again once its topic was made again"
    actor.stop()
    await task
