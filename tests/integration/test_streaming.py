"""Token streaming through a real worker on a real broker with the real SmolLM2: streamed
requests interleaved with ordinary ones, and `tokenmill submit --stream`.

Each streamed request's chunks come before its result on the result's partition, in `seq`
order, and add up to the result's text and tokens exactly (Japanese text whose characters
span several tokens; a stop string that must never have been streamed). A consumer that
keeps only `GenerateResult/1` records sees one result per request, as without streaming, and
the ordinary requests' outputs are those of their streamed twins.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import ConsumerRecord

from actors.streaming.detokenizer import REPLACEMENT
from actors.streaming.policy import StreamPolicy
from gpu.engine import Engine, EngineRequest
from gpu.engine_config import EngineConfig
from gpu.loading.loader import load_model
from gpu.sequence import SamplingParams
from messages import headers as h
from messages.chunk import GenerateChunk
from messages.codec import JSON, MSGPACK, Codec, normalize_content_type
from messages.request import GenerateRequest
from messages.result import FinishReason, GenerateResult
from tests.integration.pipeline import (
    Lane,
    new_lane,
    produce,
    request_codec,
    running_worker,
    wait_committed_to_end,
)
from tests.integration.test_cli_submit import submit

pytestmark = pytest.mark.slow

chunk_codec = Codec(GenerateChunk)
result_codec = Codec(GenerateResult)
PROMPTS = [
    "Say good morning in Japanese:",  # characters split across tokens
    "Write the word café and naïve:",
    "The capital of France is",
    "Translate to Chinese: thank you",
]
MAX_NEW = 20


@pytest.fixture(scope="module")
def engine(smollm2_path: Path) -> Iterator[Engine]:
    yield Engine(load_model(smollm2_path, name="smollm2-135m"), EngineConfig())


def greedy_text(engine: Engine, prompt: list[int], max_new: int) -> str:
    """The engine's greedy text for `prompt`, run directly (no worker is running it yet)."""
    engine.add(EngineRequest("probe", prompt, SamplingParams(max_new_tokens=max_new)))
    while engine.has_work():
        for completion in engine.step().finished:
            return completion.text
    raise AssertionError("the probe never finished")


async def replies(
    lane: Lane, ids: set[str], within_s: float = 300.0
) -> list[ConsumerRecord[bytes, bytes]]:
    """Every record on the results topic, from the start, once each id has a result."""
    consumer = AIOKafkaConsumer(
        lane.results,
        bootstrap_servers=lane.bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    records: list[ConsumerRecord[bytes, bytes]] = []
    answered: set[str] = set()
    try:
        deadline = time.monotonic() + within_s
        while not ids <= answered and time.monotonic() < deadline:
            fetched = await consumer.getmany(timeout_ms=500)
            for record in (r for batch in fetched.values() for r in batch):
                records.append(record)
                if h.header(record.headers, h.SCHEMA) == h.RESULT_SCHEMA.encode():
                    answered.add(result_codec.decode(record.value or b"", ctype(record)).id)
    finally:
        await consumer.stop()
    return records


def ctype(record: ConsumerRecord[bytes, bytes]) -> str:
    return normalize_content_type(h.header(record.headers, h.CONTENT_TYPE))


async def test_streamed_and_ordinary_requests_interleaved(
    engine: Engine, kafka_bootstrap: str
) -> None:
    tokenizer = engine.model.tokenizer
    france = tokenizer.encode(PROMPTS[2])
    probe = greedy_text(engine, france, MAX_NEW)
    stop = probe[len(probe) // 2 : len(probe) // 2 + 5]  # it stops halfway, where this begins
    assert stop.strip(), probe
    streamed = {
        "s-every-token": dict(stream_interval_tokens=1, stream_interval_ms=0),
        "s-three-tokens": dict(stream_interval_tokens=3, stream_interval_ms=10_000),
        "s-defaults": {},
        "s-by-time": dict(stream_interval_tokens=1000, stream_interval_ms=1),
    }
    requests: list[GenerateRequest] = []
    for i, prompt in enumerate(PROMPTS):
        for name, fields in streamed.items():
            requests.append(
                GenerateRequest(
                    id=f"{name}-{i}", prompt=prompt, max_new_tokens=MAX_NEW, stream=True, **fields
                )
            )
            if name == "s-every-token":
                requests.append(
                    GenerateRequest(id=f"plain-{i}", prompt=prompt, max_new_tokens=MAX_NEW)
                )
    requests.append(
        GenerateRequest(
            id="s-stop", prompt_token_ids=france, max_new_tokens=MAX_NEW, stop=[stop],
            stream=True, stream_interval_tokens=1, stream_interval_ms=0,
        )
    )  # fmt: skip
    requests.append(
        GenerateRequest(
            id="plain-stop", prompt_token_ids=france, max_new_tokens=MAX_NEW, stop=[stop]
        )
    )
    requests.append(  # n seeded choices, streamed each under its index, with logprobs
        GenerateRequest(
            id="s-choices", prompt=PROMPTS[2], max_new_tokens=MAX_NEW, stream=True, n=2,
            seed=5, temperature=0.9, logprobs=2, stream_interval_tokens=2, stream_interval_ms=0,
        )
    )  # fmt: skip
    packed = GenerateRequest(
        id="s-msgpack", prompt=PROMPTS[0], max_new_tokens=MAX_NEW, stream=True,
        stream_interval_tokens=2,
    )  # fmt: skip
    ids = {r.id for r in [*requests, packed]}
    lane = await new_lane(kafka_bootstrap, 3)
    await produce(lane.bootstrap, lane.requests, requests)
    await produce(
        lane.bootstrap,
        lane.requests,
        [request_codec.encode(packed, MSGPACK)],
        keys=[packed.id.encode()],
        headers=[(h.CONTENT_TYPE, MSGPACK.encode())],
    )
    config = lane.worker_config(streaming=StreamPolicy(min_interval_ms=0))
    async with running_worker(config, engine):
        records = await replies(lane, ids)
        await wait_committed_to_end(lane)

    results: dict[str, list[tuple[ConsumerRecord[bytes, bytes], GenerateResult]]] = defaultdict(
        list
    )
    chunks: dict[str, list[tuple[ConsumerRecord[bytes, bytes], GenerateChunk]]] = defaultdict(list)
    for record in records:
        schema = h.header(record.headers, h.SCHEMA)
        if schema == h.RESULT_SCHEMA.encode():
            result = result_codec.decode(record.value or b"", ctype(record))
            results[result.id].append((record, result))
        else:
            assert schema == h.CHUNK_SCHEMA.encode()
            chunk = chunk_codec.decode(record.value or b"", ctype(record))
            assert record.key == chunk.id.encode()
            chunks[chunk.id].append((record, chunk))

    # A consumer that keeps only results sees one per request, and nothing else.
    assert set(results) == ids and all(len(found) == 1 for found in results.values())
    assert set(chunks) == {i for i in ids if i.startswith("s-")}
    final = {i: found[0][1] for i, found in results.items()}
    assert all(result.error is None for result in final.values()), final
    for i in range(len(PROMPTS)):  # streaming changes no output
        for name in streamed:
            assert final[f"{name}-{i}"].token_ids == final[f"plain-{i}"].token_ids
            assert final[f"{name}-{i}"].text == final[f"plain-{i}"].text
    assert final["s-msgpack"].token_ids == final["plain-0"].token_ids
    assert final["s-stop"].finish_reason == FinishReason.STOP
    assert final["s-stop"].text == final["plain-stop"].text == probe[: len(probe) // 2]

    for request_id, every in chunks.items():
        own = [(r, c) for r, c in every if c.index == 0]  # the result's text is choice 0's
        ((result_record, result),) = results[request_id]
        wire = MSGPACK if request_id == "s-msgpack" else JSON  # the request's content type
        assert {ctype(r) for r, _ in own} == {ctype(result_record)} == {wire}
        assert {r.partition for r, _ in own} == {result_record.partition}
        assert max(r.offset for r, _ in own) < result_record.offset  # the result comes last
        assert len({c.run for _, c in own}) == 1
        assert [c.seq for _, c in own] == list(range(len(own)))
        assert "".join(c.text for _, c in own) == result.text
        assert [t for _, c in own for t in c.token_ids] == result.token_ids
        for _, chunk in own[:-1]:  # only the result's own text may end on a partial character
            assert REPLACEMENT not in chunk.text[-1:]
        if request_id.startswith("s-every-token"):
            assert len(own) >= result.usage.completion_tokens // 2
        if request_id.startswith("s-three-tokens"):
            assert all(len(c.token_ids) >= 3 for _, c in own[1:-1])
    choices = final["s-choices"].choices
    assert [c.index for c in choices] == [0, 1]
    for choice in choices:  # each choice's chunks are its text, tokens and logprobs
        mine = [c for _, c in chunks["s-choices"] if c.index == choice.index]
        assert [c.seq for c in mine] == list(range(len(mine)))
        assert "".join(c.text for c in mine) == choice.text
        assert [t for c in mine for t in c.token_ids] == choice.token_ids
        assert choice.logprobs is not None and all(c.logprobs is not None for c in mine)
        for key in ("tokens", "token_logprobs", "top_ids", "top_logprobs", "top_tokens"):
            assert [v for c in mine for v in getattr(c.logprobs, key)] == getattr(
                choice.logprobs, key
            )
    assert all(c.logprobs is None for _, c in chunks["s-every-token-0"])  # none asked
    streamed_before_stop = "".join(c.text for _, c in chunks["s-stop"][:-1])
    assert stop not in streamed_before_stop
    assert final["s-stop"].text.startswith(streamed_before_stop)
    assert any("\u3040" <= ch <= "\u30ff" for ch in final["s-every-token-0"].text)  # kana


async def test_submit_stream_prints_the_text(engine: Engine, kafka_bootstrap: str) -> None:
    prompt = PROMPTS[1]
    expected = greedy_text(engine, engine.model.tokenizer.encode(prompt), MAX_NEW)
    lane = await new_lane(kafka_bootstrap, 2)
    async with running_worker(lane.worker_config(), engine):
        done = await asyncio.to_thread(
            submit,
            prompt, "--stream", "--max-new-tokens", str(MAX_NEW), "--timeout", "200",
            "--topic", lane.requests, "--results-topic", lane.results,
            bootstrap=lane.bootstrap, timeout=240,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == expected + "\n"
    assert "length: 20 tokens" in done.stderr
