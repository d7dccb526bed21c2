"""The GPU actor on a real (tiny) engine, without Kafka: deadlines, refusals, stop."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from actors.faults import Faults
from actors.gpu_actor import GpuActor
from actors.guards.step_progress import StepProgress
from actors.guards.watchdog import Watchdog
from actors.mail import Admitted, Batch, Outcome, RecordRef
from actors.runtime import Actor
from actors.telemetry.trace_context import TraceContext
from gpu.engine import Engine
from gpu.engine_config import EngineConfig
from gpu.loading.loader import load_model
from messages.error_codes import ErrorCode
from messages.request import GenerateRequest


class Collector(Actor[Outcome]):
    """Stands in for the emitter: keeps what it is sent."""

    def __init__(self) -> None:
        super().__init__("collector", 1000)

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
        trace=TraceContext(),
        consumed_at=now,
        deadline=now + deadline_in if deadline_in is not None else None,
    )


@pytest.fixture
def engine(tiny_checkpoints) -> Engine:
    model = load_model(tiny_checkpoints["llama"], name="tiny")
    return Engine(model, EngineConfig(max_num_seqs=4))


async def start(engine: Engine) -> tuple[GpuActor, Collector, asyncio.Task[None]]:
    collector = Collector()
    actor = GpuActor(engine, collector, "w1")
    return actor, collector, asyncio.create_task(actor.run())


async def test_a_copy_of_a_running_id_gets_the_same_result(engine: Engine) -> None:
    """Redelivery after a rebalance, or a client retry: at-least-once, never a false error."""
    actor, collector, task = await start(engine)
    first, copy = item("a", 3), item("a", 3)
    copy.record = RecordRef("requests", 1, 77, 0)
    await actor.send(Batch(bucket=32, items=[first, copy], tokens=6, reason="size"))
    outcomes = await collector.outcomes(2)
    actor.stop()
    await task
    assert [o.result.error for o in outcomes] == [None, None]
    assert outcomes[0].result.token_ids == outcomes[1].result.token_ids
    assert {o.record.partition for o in outcomes} == {0, 1}, "each record is answered"
    assert all(o.admitted and o.cost_tokens == 6 for o in outcomes)


async def test_the_engine_refuses_what_the_door_let_through(engine: Engine) -> None:
    actor, collector, task = await start(engine)
    too_long = item("long", 4096)  # over max_model_len: the engine's own check
    await actor.send(Batch(bucket=32, items=[too_long], tokens=3, reason="size"))
    (outcome,) = await collector.outcomes(1)
    actor.stop()
    await task
    assert outcome.result.error.code == ErrorCode.MAX_TOKENS_TOO_LARGE


class BrokenStep(Engine):
    def step(self):  # type: ignore[override]
        raise RuntimeError("device lost")


async def test_a_failing_step_answers_its_requests_with_engine_error(tiny_checkpoints) -> None:
    engine = BrokenStep(load_model(tiny_checkpoints["llama"], name="tiny"), EngineConfig())
    actor, collector, task = await start(engine)
    await actor.send(Batch(bucket=32, items=[item("x", 3), item("y", 3)], tokens=6, reason="size"))
    outcomes = await collector.outcomes(2)
    assert {o.result.error.code for o in outcomes} == {ErrorCode.ENGINE_ERROR}
    assert "device lost" in outcomes[0].result.error.message
    assert not task.done(), "the actor goes on"
    actor.stop()
    await task


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
    running = asyncio.Event()  # two steps ran: the requests are decoding, far from 400 tokens
    actor.on_step = lambda out: running.set() if actor.steps >= 2 else None
    await actor.send(Batch(bucket=32, items=[item(f"r{i}", 400) for i in range(6)], tokens=18,
                           reason="size"))  # fmt: skip
    await asyncio.wait([asyncio.create_task(running.wait()), task], return_when="FIRST_COMPLETED")
    actor.stop()
    await task
    outcomes = await collector.outcomes(6)
    assert {o.result.error.code for o in outcomes} == {ErrorCode.SHUTTING_DOWN}
    assert not engine.has_work()


class Gate(threading.Event):
    """A hung step's `unhang`: says when the engine thread starts waiting on it."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()

    def wait(self, timeout: float | None = None) -> bool:
        self.entered.set()
        return super().wait(timeout)


async def test_a_hung_step_shows_in_its_progress_until_it_returns(engine: Engine) -> None:
    """`hang_step_after=1`: the second step hangs on the engine thread; the watchdog, looking
    past the bound, finds it; once released, the request is answered as usual."""
    faults = Faults(hang_step_after=1)
    faults.unhang = gate = Gate()
    progress = StepProgress(floor_s=1.0, multiple=10.0)
    collector = Collector()
    actor = GpuActor(engine, collector, "w1", faults=faults, progress=progress)
    task = asyncio.create_task(actor.run())
    try:
        await actor.send(Batch(bucket=32, items=[item("h", 4)], tokens=3, reason="size"))
        assert await asyncio.to_thread(gate.entered.wait, 60)  # a hang bound only
        assert progress.steps == 1 and progress.running_since is not None
        stalls: list[str] = []
        later = Watchdog(progress, stalls.append, clock=lambda: time.monotonic() + 1000)
        assert Watchdog(progress, stalls.append).check() is None, "not yet past the bound"
        assert later.check() is not None and len(stalls) == 1
    finally:
        faults.unhang.set()
    (outcome,) = await collector.outcomes(1)
    actor.stop()
    await task
    assert outcome.result.error is None and len(outcome.result.token_ids) == 4
    assert progress.running_since is None and progress.steps >= 4
