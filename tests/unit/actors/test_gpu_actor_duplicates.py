"""A request reusing the id of a running one, on a real (tiny) engine without Kafka: a copy
(the same request for the same reply topic) shares the run's result; anything else is answered
`duplicate_request` on its own reply topic, never with the other request's output."""

from __future__ import annotations

import asyncio

import msgspec
from structlog.testing import capture_logs

from actors.gpu_actor import GpuActor
from actors.mail import Batch, Outcome, RecordRef
from gpu.engine import Engine
from messages.error_codes import ErrorCode
from tests.unit.actors.test_gpu_actor import Collector, engine, item

__all__ = ["engine"]  # the fixture


async def _run(engine: Engine, batches: list[Batch], n: int) -> list[Outcome]:
    collector = Collector()
    actor = GpuActor(engine, collector, "w1")  # type: ignore[arg-type]
    for batch in batches:
        await actor.send(batch)
    task = asyncio.create_task(actor.run())
    outcomes = await collector.outcomes(n)
    actor.stop()
    await task
    return outcomes


def code(outcome: Outcome) -> ErrorCode | None:
    return outcome.result.error.code if outcome.result.error is not None else None


async def test_another_reply_topic_gets_duplicate_request_not_the_output(engine: Engine) -> None:
    first, other = item("a", 3), item("a", 3)
    other.record = RecordRef("requests", 1, 77, 0)
    other.reply_topic = "someone-elses-results"
    batch = Batch(bucket=32, items=[first, other], tokens=6, reason="size")
    with capture_logs() as logs:
        outcomes = await _run(engine, [batch], 2)
    by_topic = {o.reply_topic: o for o in outcomes}
    assert len(outcomes) == 2 and set(by_topic) == {"results", "someone-elses-results"}
    ran, refused = by_topic["results"], by_topic["someone-elses-results"]
    assert ran.result.error is None and len(ran.result.token_ids) == 3
    assert ran.record.partition == 0
    assert code(refused) is ErrorCode.DUPLICATE_REQUEST
    assert refused.result.token_ids == [] and refused.result.text == ""
    assert refused.record.partition == 1, "its own record is answered (its offset is done)"
    assert [e["offset"] for e in logs if e["event"] == "duplicate_request"] == [77]


async def test_another_request_under_the_same_id_gets_duplicate_request(engine: Engine) -> None:
    """Same reply topic, another prompt: its reader must not take the first's output for its own."""
    first, other = item("a", 3), item("a", 3)
    other.record = RecordRef("requests", 1, 77, 0)
    other.request = msgspec.structs.replace(other.request, prompt_token_ids=[9, 9, 9])
    batch = Batch(bucket=32, items=[first, other], tokens=6, reason="size")
    outcomes = await _run(engine, [batch], 2)
    by_partition = {o.record.partition: o for o in outcomes}
    assert by_partition[0].result.error is None
    assert code(by_partition[1]) is ErrorCode.DUPLICATE_REQUEST
    assert by_partition[1].result.token_ids == []


async def test_a_duplicate_in_a_later_batch_is_answered_at_once(engine: Engine) -> None:
    """The first still runs (400 tokens) when the duplicate comes: the error is not held back."""
    first, other = item("a", 400), item("a", 3)
    other.record = RecordRef("requests", 1, 77, 0)
    batches = [
        Batch(bucket=32, items=[first], tokens=3, reason="size"),
        Batch(bucket=32, items=[other], tokens=3, reason="size"),
    ]
    (refused,) = await _run(engine, batches, 1)
    assert refused.record.partition == 1
    assert code(refused) is ErrorCode.DUPLICATE_REQUEST


async def test_the_id_may_run_again_once_the_first_is_done(engine: Engine) -> None:
    collector = Collector()
    actor = GpuActor(engine, collector, "w1")  # type: ignore[arg-type]
    task = asyncio.create_task(actor.run())
    first, later = item("a", 3), item("a", 3)
    later.reply_topic = "other"
    await actor.send(Batch(bucket=32, items=[first], tokens=3, reason="size"))
    (done,) = await collector.outcomes(1)
    await actor.send(Batch(bucket=32, items=[later], tokens=3, reason="size"))
    (again,) = await collector.outcomes(1)
    actor.stop()
    await task
    assert done.result.error is None and again.result.error is None
    assert again.reply_topic == "other"
