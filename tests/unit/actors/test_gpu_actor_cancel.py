"""Cancels in the GPU actor on a real (tiny) engine, without Kafka: queued, running, copies,
a cancel that comes after the request's own finish, an id held nowhere."""

from __future__ import annotations

import asyncio
from typing import Any

from actors.gpu_actor import GpuActor
from actors.mail import Batch, Cancel, CancelledIn, RecordRef
from gpu.engine import Engine, StepOutput
from messages.result import FinishReason
from tests.unit.actors.test_gpu_actor import Collector, engine, item

__all__ = ["engine"]  # the fixture


class Found(list[CancelledIn | None]):
    """What each cancel found, as the GPU actor reports it; `wait(n)` for the n-th."""

    def __init__(self) -> None:
        super().__init__()
        self.changed = asyncio.Event()

    def __call__(self, where: CancelledIn | None) -> None:
        self.append(where)
        self.changed.set()

    async def wait(self, n: int) -> None:
        async with asyncio.timeout(30):
            while len(self) < n:
                self.changed.clear()
                await self.changed.wait()


def actor_on(engine: Engine, **kwargs: Any) -> tuple[GpuActor, Collector, Found]:
    collector, found = Collector(), Found()
    return GpuActor(engine, collector, "w1", on_cancel=found, **kwargs), collector, found


async def test_a_cancel_behind_its_batch_answers_it_unrun(engine: Engine) -> None:
    actor, collector, found = actor_on(engine)
    batch = Batch(bucket=32, items=[item("a", 50), item("b", 3)], tokens=6, reason="size")
    await actor.send(batch)
    await actor.send(Cancel("a"))  # in the same mailbox drain: still queued
    task = asyncio.create_task(actor.run())
    outcomes = {o.result.id: o for o in await collector.outcomes(2)}
    actor.stop()
    await task
    cancelled = outcomes["a"]
    assert cancelled.result.finish_reason is FinishReason.CANCELLED
    assert cancelled.result.token_ids == [] and cancelled.result.error is None
    assert cancelled.cancelled_in == "queue" and cancelled.admitted
    assert outcomes["b"].result.finish_reason is FinishReason.LENGTH
    assert found == ["queue"]


async def test_a_running_request_and_its_copy_get_the_tokens_made_so_far(engine: Engine) -> None:
    three_tokens = asyncio.Event()

    def stepped(out: StepOutput) -> None:
        if sum(request_id == "long" for request_id, _ in out.new_tokens) and (
            len(engine.sequences["long"].output_token_ids) >= 3
        ):
            three_tokens.set()

    actor, collector, found = actor_on(engine, on_step=stepped)
    first, copy = item("long", 400), item("long", 400)
    copy.record = RecordRef("requests", 1, 9, 0)
    task = asyncio.create_task(actor.run())
    await actor.send(Batch(bucket=32, items=[first, copy], tokens=6, reason="size"))
    await asyncio.wait_for(three_tokens.wait(), 60)
    await actor.send(Cancel("long", "user"))
    outcomes = await collector.outcomes(2)
    actor.stop()
    await task
    assert {o.record.partition for o in outcomes} == {0, 1}, "each record is answered"
    for outcome in outcomes:
        assert outcome.result.finish_reason is FinishReason.CANCELLED
        assert 3 <= len(outcome.result.token_ids) < 400
    assert outcomes[0].result.token_ids == outcomes[1].result.token_ids
    assert found == ["engine"] and "long" not in engine.sequences and not actor.in_flight


async def test_a_cancel_after_the_finish_answers_nothing_again(engine: Engine) -> None:
    actor, collector, found = actor_on(engine)
    task = asyncio.create_task(actor.run())
    await actor.send(Batch(bucket=32, items=[item("quick", 2)], tokens=3, reason="wait"))
    (done,) = await collector.outcomes(1)
    await actor.send(Cancel("quick"))
    await actor.send(Cancel("never-seen"))
    await found.wait(2)
    actor.stop()
    await task
    assert done.result.finish_reason is FinishReason.LENGTH
    assert found == [None, None] and collector.mailbox.empty()
