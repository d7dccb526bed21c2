"""The GPU actor on a real (tiny) engine, without Kafka: deadlines, refusals, stop."""

from __future__ import annotations

import asyncio
import time

import pytest

from actors.gpu_actor import GpuActor
from actors.mail import Admitted, Batch, Outcome, RecordRef
from actors.runtime import Actor
from gpu.engine import Engine
from gpu.engine_config import EngineConfig
from gpu.loader import load_model
from messages.error_codes import ErrorCode
from messages.request import GenerateRequest
from messages.result import ModelRef


class Collector(Actor[Outcome]):
    """Stands in for the emitter: keeps what it is sent."""

    def __init__(self) -> None:
        super().__init__("collector", mailbox_size=1000)

    async def run(self) -> None:  # never started: tests read the mailbox
        raise NotImplementedError

    async def outcomes(self, n: int) -> list[Outcome]:
        out = []
        async with asyncio.timeout(60):
            while len(out) < n:
                out.append(await self.mailbox.get())
        return out


def item(request_id: str, max_new_tokens: int, deadline_in: float | None = None) -> Admitted:
    now = time.monotonic()
    return Admitted(
        request=GenerateRequest(
            id=request_id, prompt_token_ids=[5, 6, 7], max_new_tokens=max_new_tokens
        ),
        record=RecordRef("requests", 0, hash(request_id) % 1000, 0),
        prompt_token_ids=[5, 6, 7],
        reply_topic="results",
        content_type="application/json",
        trace=[],
        consumed_at=now,
        deadline=now + deadline_in if deadline_in is not None else None,
    )


@pytest.fixture
def engine(tiny_checkpoints) -> Engine:
    model = load_model(tiny_checkpoints["llama"], name="tiny")
    return Engine(model, EngineConfig(max_num_seqs=4))


async def start(engine: Engine) -> tuple[GpuActor, Collector, asyncio.Task[None]]:
    collector = Collector()
    actor = GpuActor(engine, ModelRef(name="tiny", digest="d"), collector, "w1")
    return actor, collector, asyncio.create_task(actor.run())


async def test_results_and_a_refusal_from_the_engine(engine: Engine) -> None:
    actor, collector, task = await start(engine)
    await actor.send(Batch(bucket=32, items=[item("a", 3), item("a", 3)], tokens=6, reason="size"))
    outcomes = {o.result.error is None: o for o in await collector.outcomes(2)}
    actor.stop()
    await task
    assert outcomes[True].result.usage.completion_tokens == 3
    assert outcomes[True].admitted and outcomes[True].cost_tokens == 6
    assert outcomes[False].result.error.code == ErrorCode.DUPLICATE_REQUEST


async def test_a_request_past_its_deadline_is_aborted(engine: Engine) -> None:
    actor, collector, task = await start(engine)
    await actor.send(Batch(bucket=32, items=[item("slow", 400, deadline_in=0.05)], tokens=3,
                           reason="wait"))  # fmt: skip
    (outcome,) = await collector.outcomes(1)
    actor.stop()
    await task
    assert outcome.result.error.code == ErrorCode.DEADLINE_EXCEEDED
    assert outcome.result.finish_reason == "deadline"
    assert len(outcome.result.token_ids) < 400


async def test_stop_fails_what_is_left_with_shutting_down(engine: Engine) -> None:
    actor, collector, task = await start(engine)
    await actor.send(Batch(bucket=32, items=[item(f"r{i}", 400) for i in range(6)], tokens=18,
                           reason="size"))  # fmt: skip
    await asyncio.sleep(0.2)  # some steps run
    actor.stop()
    await task
    outcomes = await collector.outcomes(6)
    assert {o.result.error.code for o in outcomes} == {ErrorCode.SHUTTING_DOWN}
    assert not engine.has_work()
