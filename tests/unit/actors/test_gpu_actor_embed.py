"""The GPU actor serving an embedding model (a fake encoder engine, no Kafka): embedding
requests run and are answered with their vectors; deadlines, cancels, copies, a crash and a
stop work as for generation; a generation request finds no engine for it."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from actors.faults import Faults, InjectedFault
from actors.gpu_actor import GpuActor
from actors.ingest.model_front import EmbedInputs, ModelFront
from actors.mail import Admitted, Batch, Cancel, Outcome, RecordRef
from actors.telemetry.trace_context import TraceContext
from messages.embedding import EmbedRequest, EmbedResult
from messages.error_codes import ErrorCode
from messages.request import GenerateRequest
from messages.request_kinds import Request
from tests.unit.actors.fake_encoder import FakeEncoder, vector
from tests.unit.actors.test_gpu_actor import Collector

INPUTS = ([2, 10, 11, 1], [2, 12, 1])


def item(
    request_id: str,
    inputs: tuple[list[int], ...] = INPUTS,
    *,
    dimensions: int | None = None,
    deadline_in: float | None = None,
    offset: int = 0,
) -> Admitted:
    now = time.monotonic()
    request = EmbedRequest(id=request_id, input=[list(i) for i in inputs], dimensions=dimensions)
    embed = EmbedInputs(inputs)
    return admitted(request, embed.tokens, embed, now + deadline_in if deadline_in else None,
                    offset)  # fmt: skip


def admitted(
    request: Request,
    tokens: list[int],
    embed: EmbedInputs | None,
    deadline: float | None = None,
    offset: int = 0,
) -> Admitted:
    return Admitted(
        request=request,
        record=RecordRef("requests", 0, offset, 0),
        prompt_token_ids=tokens,
        reply_topic="results",
        content_type="application/json",
        trace=TraceContext(),
        consumed_at=time.monotonic(),
        deadline=deadline,
        embed=embed,
    )


async def start(engine: FakeEncoder) -> tuple[GpuActor, Collector, asyncio.Task[None]]:
    collector = Collector()
    actor = GpuActor(engine, collector, "w1")
    return actor, collector, asyncio.create_task(actor.run())


async def stopped(actor: GpuActor, task: asyncio.Task[None]) -> None:
    actor.stop()
    await task


def embed_result(outcome: Outcome) -> EmbedResult:
    assert isinstance(outcome.result, EmbedResult), outcome.result
    return outcome.result


async def test_an_embedding_batch_is_run_and_answered_with_its_vectors() -> None:
    engine = FakeEncoder()
    actor, collector, task = await start(engine)
    await actor.send(Batch(bucket=32, items=[item("a"), item("b", dimensions=4, offset=1)],
                           tokens=14, reason="size"))  # fmt: skip
    outcomes = await collector.outcomes(2)
    await stopped(actor, task)
    full, cut = (embed_result(o) for o in sorted(outcomes, key=lambda o: o.result.id))
    assert full.ok and [e.index for e in full.data] == [0, 1]
    assert np.allclose(full.data[1].embedding, vector(INPUTS[1], 8))
    assert (full.dimensions, cut.dimensions) == (8, 4)
    assert np.allclose(cut.data[0].embedding, vector(INPUTS[0], 8, 4))
    assert full.usage.prompt_tokens == 7 and full.model is not None
    assert full.model.task == "embed" and full.model.name == "fake-embed"
    (added, _) = engine.added
    assert added.embed is not None and added.embed.inputs == INPUTS
    assert list(added.prompt_token_ids) == [*INPUTS[0], *INPUTS[1]]
    assert all(o.admitted and o.cost_tokens == 7 for o in outcomes)


async def test_a_copy_of_a_running_embedding_request_gets_its_vectors() -> None:
    actor, collector, task = await start(FakeEncoder(steps_needed=3))
    first, copy = item("a"), item("a", offset=9)
    await actor.send(Batch(bucket=32, items=[first, copy], tokens=14, reason="size"))
    outcomes = await collector.outcomes(2)
    await stopped(actor, task)
    one, other = (embed_result(o) for o in outcomes)
    assert one.ok and one.data == other.data
    assert {o.record.offset for o in outcomes} == {0, 9}


async def test_an_embedding_request_past_its_deadline_is_aborted() -> None:
    actor, collector, task = await start(FakeEncoder(steps_needed=10**9))
    await actor.send(Batch(bucket=32, items=[item("slow", deadline_in=0.05)], tokens=7,
                           reason="wait"))  # fmt: skip
    (outcome,) = await collector.outcomes(1)
    await stopped(actor, task)
    result = embed_result(outcome)
    assert result.error is not None and result.error.code is ErrorCode.DEADLINE_EXCEEDED
    assert result.data == []


async def test_a_cancel_stops_an_embedding_request_in_the_engine() -> None:
    engine = FakeEncoder(steps_needed=10**9)
    actor, collector, task = await start(engine)
    await actor.send(Batch(bucket=32, items=[item("c")], tokens=7, reason="size"))
    await actor.send(Cancel("c", reason="test"))
    (outcome,) = await collector.outcomes(1)
    await stopped(actor, task)
    result = embed_result(outcome)
    assert result.error is not None and result.error.code is ErrorCode.CANCELLED
    assert not engine.has_work()


async def test_stop_answers_running_embedding_requests_shutting_down() -> None:
    engine = FakeEncoder(steps_needed=10**9)
    actor, collector, task = await start(engine)
    stepped = asyncio.Event()
    actor.on_step = lambda out: stepped.set()
    await actor.send(Batch(bucket=32, items=[item("x"), item("y", offset=1)], tokens=14,
                           reason="size"))  # fmt: skip
    await stepped.wait()
    await stopped(actor, task)
    outcomes = await collector.outcomes(2)
    assert {embed_result(o).error.code for o in outcomes} == {ErrorCode.SHUTTING_DOWN}  # type: ignore[union-attr]
    assert not engine.has_work()


async def test_after_a_crash_a_running_embedding_request_runs_again() -> None:
    engine = FakeEncoder(steps_needed=3)
    actor, collector, task = await start(engine)
    actor.faults = Faults(gpu_crash_after_steps=1, gpu_crashes=1)
    await actor.send(Batch(bucket=32, items=[item("r")], tokens=7, reason="size"))
    with pytest.raises(InjectedFault):
        await task
    assert actor.running == 1
    assert actor.recover() == [], "first crash: queued again, nothing failed"
    assert not engine.has_work()
    task = asyncio.create_task(actor.run())
    (outcome,) = await collector.outcomes(1)
    await stopped(actor, task)
    assert embed_result(outcome).ok and len(embed_result(outcome).data) == 2


async def test_a_generation_request_tokenized_for_another_model_is_unsupported_here() -> None:
    """Queued before a flip to the embedding model: tokenized again, and refused."""
    actor, collector, task = await start(FakeEncoder())
    stale = admitted(GenerateRequest(id="g", prompt_token_ids=[5, 6]), [5, 6], None)
    stale.model_digest = "sha256:the-generative-model"
    await actor.send(Batch(bucket=32, items=[stale], tokens=2, reason="size"))
    (outcome,) = await collector.outcomes(1)
    await stopped(actor, task)
    assert outcome.result.error is not None
    assert outcome.result.error.code is ErrorCode.UNSUPPORTED_TASK
    assert not isinstance(outcome.result, EmbedResult)


async def test_an_embedding_request_queued_before_a_flip_is_tokenized_again() -> None:
    engine = FakeEncoder()
    actor, collector, task = await start(engine)
    request = EmbedRequest(id="t", input="hi")
    stale = admitted(request, [9, 9], EmbedInputs(([9, 9],)))
    stale.model_digest = "sha256:an-older-embedding-model"
    await actor.send(Batch(bucket=32, items=[stale], tokens=2, reason="size"))
    (outcome,) = await collector.outcomes(1)
    await stopped(actor, task)
    assert embed_result(outcome).ok
    expected = ModelFront.of_engine(engine).tokenize(request)
    assert isinstance(expected, EmbedInputs)
    assert engine.added[0].embed is not None
    assert engine.added[0].embed.inputs == expected.inputs
