"""The GPU actor's streaming on a real (tiny) engine, without Kafka: a streamed request's
chunks go to the emitter before its outcome and add up to its result; others get none."""

from __future__ import annotations

import asyncio
import time

import pytest

from actors.gpu_actor import GpuActor
from actors.mail import Admitted, Batch, Outcome, RecordRef, StreamChunk
from actors.runtime import Actor
from actors.streaming.policy import StreamPolicy
from actors.telemetry.trace_context import TraceContext
from gpu.engine import Engine
from gpu.engine_config import EngineConfig
from gpu.loading.loader import load_model
from messages.error_codes import ErrorCode
from messages.request import GenerateRequest
from messages.result import FinishReason

EVERY_STEP = StreamPolicy(interval_tokens=1, interval_ms=0, min_interval_ms=0)


class Collector(Actor[Outcome | StreamChunk]):
    """Stands in for the emitter: keeps what it is sent, in order."""

    def __init__(self) -> None:
        super().__init__("collector", 10_000)

    async def run(self) -> None:  # never started: tests read the mailbox
        raise NotImplementedError

    async def until_outcomes(self, n: int) -> list[Outcome | StreamChunk]:
        out: list[Outcome | StreamChunk] = []
        async with asyncio.timeout(60):
            while sum(isinstance(m, Outcome) for m in out) < n:
                out.append(await self.mailbox.get())
        return out


def item(request_id: str, max_new_tokens: int, *, stream: bool, **fields: object) -> Admitted:
    now = time.monotonic()
    return Admitted(
        request=GenerateRequest(
            id=request_id,
            prompt_token_ids=[5, 6, 7],
            max_new_tokens=max_new_tokens,
            stream=stream,
            **fields,  # type: ignore[arg-type]
        ),
        record=RecordRef("requests", 0, hash(request_id) % 1000, 0),
        prompt_token_ids=[5, 6, 7],
        reply_topic="replies",
        content_type="application/msgpack",
        trace=TraceContext.of([("traceparent", b"00-" + b"1" * 32 + b"-" + b"2" * 16 + b"-01")]),
        consumed_at=now,
        deadline=None,
    )


@pytest.fixture
def engine(tiny_checkpoints) -> Engine:
    model = load_model(tiny_checkpoints["llama"], name="tiny")
    return Engine(model, EngineConfig(max_num_seqs=4))


def by_id(messages: list[Outcome | StreamChunk]) -> dict[str, list[Outcome | StreamChunk]]:
    out: dict[str, list[Outcome | StreamChunk]] = {}
    for m in messages:
        key = m.chunk.id if isinstance(m, StreamChunk) else m.result.id
        out.setdefault(key, []).append(m)
    return out


async def test_chunks_precede_the_outcome_and_add_up_to_it(engine: Engine) -> None:
    collector = Collector()
    actor = GpuActor(engine, collector, "w1", streaming=EVERY_STEP)
    task = asyncio.create_task(actor.run())
    streamed, plain, copy, other = (
        item("s", 12, stream=True),
        item("p", 12, stream=False),
        item("s", 12, stream=True),
        item("s", 12, stream=True),
    )
    copy.record = RecordRef("requests", 1, 5, 0)  # a redelivery: the same request, same topic
    other.record = RecordRef("requests", 2, 9, 0)
    other.reply_topic = "elsewhere"  # another producer's request under the same id
    batch = Batch(bucket=32, items=[streamed, plain, copy, other], tokens=12, reason="size")
    await actor.send(batch)
    messages = by_id(await collector.until_outcomes(4))
    actor.stop()
    await task

    assert all(isinstance(m, Outcome) for m in messages["p"])  # not streamed: no chunks
    refused, *chunks, first, second = messages["s"]
    assert isinstance(refused, Outcome) and refused.reply_topic == "elsewhere"
    assert refused.result.error is not None
    assert refused.result.error.code is ErrorCode.DUPLICATE_REQUEST and not refused.result.text
    assert isinstance(first, Outcome) and isinstance(second, Outcome)  # the copy too
    assert {first.reply_topic, second.reply_topic} == {"replies"}
    assert chunks and all(isinstance(c, StreamChunk) for c in chunks)
    result = first.result
    assert result.error is None
    sent = [c.chunk for c in chunks if isinstance(c, StreamChunk)]
    assert [c.seq for c in sent] == list(range(len(sent)))
    assert "".join(c.text for c in sent) == result.text
    assert [t for c in sent for t in c.token_ids] == result.token_ids
    for c in chunks:  # where and how the result goes, the original's (not the copy's)
        assert isinstance(c, StreamChunk)
        assert (c.reply_topic, c.content_type, c.trace) == (
            "replies",
            "application/msgpack",
            streamed.trace,
        )
    assert actor.chunks_sent == len(sent)
    if len(result.token_ids) > 2:
        assert len(sent) > 1  # one step, one token, one chunk (text allowing)


async def test_an_aborted_streamed_request_gets_its_last_chunk_first(engine: Engine) -> None:
    collector = Collector()
    actor = GpuActor(engine, collector, "w1", streaming=EVERY_STEP)
    task = asyncio.create_task(actor.run())
    long = item("long", 200, stream=True, stream_interval_tokens=1000, stream_interval_ms=1e6)
    await actor.send(Batch(bucket=32, items=[long], tokens=3, reason="size"))
    async with asyncio.timeout(60):  # the first chunk comes at once, whatever the intervals
        first = await collector.mailbox.get()
    assert isinstance(first, StreamChunk) and first.chunk.seq == 0
    actor.stop()  # the running request ends with shutting_down, and its text so far
    await task
    rest = [first, *collector.drain_mailbox()]
    *chunks, outcome = rest
    assert isinstance(outcome, Outcome)
    # shutting_down (or, should random weights sample EOS that soon, stop): chunks first
    assert outcome.result.finish_reason in (FinishReason.ERROR, FinishReason.STOP)
    texts = [c.chunk.text for c in chunks if isinstance(c, StreamChunk)]
    assert "".join(texts) == outcome.result.text


async def test_each_choice_streams_under_its_index_with_its_logprobs(engine: Engine) -> None:
    collector = Collector()
    actor = GpuActor(engine, collector, "w1", streaming=EVERY_STEP)
    task = asyncio.create_task(actor.run())
    fields = {"n": 3, "seed": 7, "temperature": 1.0, "logprobs": 2}
    await actor.send(Batch(bucket=32, items=[item("s", 10, stream=True, **fields)], tokens=3,
                           reason="size"))  # fmt: skip
    *chunks, outcome = await collector.until_outcomes(1)
    actor.stop()
    await task

    assert isinstance(outcome, Outcome) and outcome.result.error is None
    choices = outcome.result.choices
    assert [c.index for c in choices] == [0, 1, 2]
    sent = [c.chunk for c in chunks if isinstance(c, StreamChunk)]
    for choice in choices:
        mine = [c for c in sent if c.index == choice.index]
        assert [c.seq for c in mine] == list(range(len(mine)))
        assert "".join(c.text for c in mine) == choice.text
        assert [t for c in mine for t in c.token_ids] == choice.token_ids
        assert choice.logprobs is not None
        for key in ("tokens", "token_logprobs", "top_ids", "top_logprobs", "top_tokens"):
            streamed = [v for c in mine if c.logprobs for v in getattr(c.logprobs, key)]
            assert streamed == getattr(choice.logprobs, key), key
    assert len({c.text for c in choices}) > 1  # each choice its own seed
