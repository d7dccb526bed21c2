"""The GPU actor and the ingest's front on a real (tiny) encoder engine, no Kafka: the vectors
a worker answers with are the engine's own; the engine's admission codes reach the result;
a swap from a generative model builds an encoder engine for an embedding folder."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from actors.gpu_actor import GpuActor
from actors.ingest.model_front import EmbedInputs, ModelFront
from actors.mail import Batch, Outcome
from gpu.encoder import EncoderEngine, load_encoder_engine
from gpu.engine_config import EngineConfig
from messages.embedding import EmbedRequest, EmbedResult
from messages.error_codes import ErrorCode
from messages.events import ModelSwapped
from tests.unit.actors.swap.test_swapper import Rig
from tests.unit.actors.test_gpu_actor import Collector
from tests.unit.actors.test_gpu_actor_embed import admitted
from tests.unit.gpu.encoder.st_folders import write_embedding_model


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_embedding_model(tmp_path_factory.mktemp("embedder"))


@pytest.fixture
def engine(folder: Path) -> EncoderEngine:
    return load_encoder_engine(folder, config=EngineConfig(max_num_batched_tokens=64))


async def test_the_vectors_answered_are_the_engines_own(engine: EncoderEngine) -> None:
    front = ModelFront.of_engine(engine)
    assert front.ref.task == "embed" and front.max_model_len == engine.embedding.max_tokens
    requests = [
        EmbedRequest(id="a", input=["the quick brown fox", "jumps"], prompt_name="query"),
        EmbedRequest(id="b", input="over the lazy dog " * 40, dimensions=8, truncate="end"),
    ]
    items = []
    for i, request in enumerate(requests):
        tokens = front.tokenize(request)
        assert isinstance(tokens, EmbedInputs)
        items.append(admitted(request, tokens.tokens, tokens, offset=i))
    collector = Collector()
    actor = GpuActor(engine, collector, "w1", front=front)
    task = asyncio.create_task(actor.run())
    await actor.send(Batch(bucket=64, items=items, tokens=0, reason="size"))
    outcomes = {o.result.id: o for o in await collector.outcomes(2)}
    actor.stop()
    await task
    for item in items:
        result = outcomes[item.request.id].result
        assert isinstance(result, EmbedResult) and result.ok, result
        assert item.embed is not None and isinstance(item.request, EmbedRequest)
        expected = engine.encode(list(item.embed.inputs), item.request.dimensions)
        got = [np.asarray(e.embedding, dtype=np.float32) for e in result.data]
        assert len(got) == len(expected)
        for ours, theirs in zip(got, expected, strict=True):
            assert float(ours @ theirs) > 0.9999 and abs(float(np.linalg.norm(ours)) - 1) < 1e-4
    b = outcomes["b"].result
    assert isinstance(b, EmbedResult) and b.truncated == 1 and b.dimensions == 8


async def test_the_engines_own_refusals_reach_the_result(engine: EncoderEngine) -> None:
    """What the door let through but the engine refuses is answered with the engine's code."""
    collector = Collector()
    actor = GpuActor(engine, collector, "w1")
    task = asyncio.create_task(actor.run())
    wide = EmbedRequest(id="wide", input=[[2, 5, 1]], dimensions=10_000)
    await actor.send(
        Batch(bucket=32, items=[admitted(wide, [2, 5, 1], EmbedInputs(([2, 5, 1],)))], tokens=3,
              reason="size")
    )  # fmt: skip
    (outcome,) = await collector.outcomes(1)
    actor.stop()
    await task
    assert isinstance(outcome.result, EmbedResult) and outcome.result.error is not None
    assert outcome.result.error.code is ErrorCode.INVALID_DIMENSIONS


async def test_a_swap_to_an_embedding_folder_builds_the_encoder(
    tiny_checkpoints: dict[str, Path], folder: Path
) -> None:
    async with Rig(tiny_checkpoints["llama"]) as rig:
        swapped = await rig.swap(folder, "embedder")
        assert isinstance(swapped, ModelSwapped), swapped
        assert swapped.to_model.task == "embed" and swapped.smoke_ms > 0
        assert isinstance(rig.gpu.engine, EncoderEngine)
        request = EmbedRequest(id="e", input="hello")
        tokens = rig.gpu.front.tokenize(request)
        assert isinstance(tokens, EmbedInputs)
        item = admitted(request, tokens.tokens, tokens)
        item.model_digest = swapped.to_model.digest
        await rig.gpu.send(Batch(bucket=32, items=[item], tokens=0, reason="size"))
        (outcome,) = await rig.outcomes.take(1, Outcome)
        assert isinstance(outcome.result, EmbedResult) and outcome.result.ok
