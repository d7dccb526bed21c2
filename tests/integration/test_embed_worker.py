"""A worker serving the real EmbeddingGemma-300M through a real broker: a jobs set of embedding
requests (texts, a list, token ids, `dimensions`, base64, task prompts, truncation), each
answered once with its vectors (of unit length, the engine's own); a generation request, a
malformed embedding request and an undecodable record each answered with their typed error;
an embedding request to a generative worker refused as unsupported. At least once and
exactly once."""

from __future__ import annotations

import base64
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiokafka import AIOKafkaConsumer

from gpu.engine import Engine
from gpu.engine_config import EngineConfig
from gpu.loading.loader import load_model
from messages import headers as h
from messages.codec import Codec, normalize_content_type
from messages.embedding import EmbedRequest, EmbedResult
from messages.error_codes import ErrorCode
from messages.request import GenerateRequest
from messages.result import GenerateResult
from tests.integration.pipeline import (
    Lane,
    WorkerProcess,
    new_lane,
    produce,
    read_all,
    running_worker,
    wait_committed_to_end,
)

pytestmark = pytest.mark.slow

embed_requests = Codec(EmbedRequest)
EMBED_HEADER = [(h.SCHEMA, h.EMBED_REQUEST_SCHEMA.encode())]
LONG = "Kafka keeps an ordered, replicated log of records per partition. " * 200  # > 2048 tokens


@pytest.fixture(scope="module")
def encoder(embeddinggemma_dir: Path) -> Iterator[Any]:
    """The real model, loaded once for the module's workers (each drains before the next)."""
    from gpu.encoder import load_encoder_engine

    yield load_encoder_engine(embeddinggemma_dir, name="embeddinggemma-300m")


Answer = EmbedResult | GenerateResult
_decoders = {
    h.EMBED_RESULT_SCHEMA.encode(): Codec(EmbedResult),
    h.RESULT_SCHEMA.encode(): Codec(GenerateResult),
}


async def answers(
    lane: Lane, ids: set[str], *, isolation: str = "read_uncommitted", within_s: float = 600
) -> dict[str, list[Answer]]:
    """Every result on the lane's results topic by id, read by its schema header, once each of
    `ids` has one."""
    consumer = AIOKafkaConsumer(
        lane.results,
        bootstrap_servers=lane.bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        isolation_level=isolation,
    )
    await consumer.start()
    found: dict[str, list[Answer]] = defaultdict(list)
    try:
        deadline = time.monotonic() + within_s
        while not ids <= found.keys() and time.monotonic() < deadline:
            for batch in (await consumer.getmany(timeout_ms=500)).values():
                for record in batch:
                    codec = _decoders[h.header(record.headers, h.SCHEMA) or b""]
                    content_type = normalize_content_type(h.header(record.headers, h.CONTENT_TYPE))
                    result = codec.decode(record.value or b"", content_type)
                    found[result.id].append(result)
    finally:
        await consumer.stop()
    return dict(found)


async def produce_embeds(lane: Lane, requests: list[EmbedRequest], **kw: Any) -> None:
    await produce(
        lane.bootstrap,
        lane.requests,
        [embed_requests.encode(r) for r in requests],
        keys=[r.id.encode() for r in requests],
        **kw,
    )


def vectors(result: Answer) -> list[np.ndarray]:
    """A result's vectors as float32 arrays, whichever encoding they came in."""
    assert isinstance(result, EmbedResult) and result.ok, result
    out = []
    for position, item in enumerate(result.data):
        assert item.index == position, "in input order"
        if isinstance(item.embedding, str):
            out.append(np.frombuffer(base64.b64decode(item.embedding), dtype="<f4"))
        else:
            out.append(np.asarray(item.embedding, dtype=np.float32))
    return out


def direct(encoder: Any, text: str, prompt_name: str | None = None, dims: int | None = None):
    """The engine's own vector for `text`, alone, without the worker."""
    from gpu.encoder.inputs import embed_tokens

    tokens = embed_tokens(encoder.model.tokenizer, encoder.embedding, text, prompt_name)
    (vector,) = encoder.encode([tokens], dims)
    return np.asarray(vector, dtype=np.float32)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def jobs(encoder: Any) -> tuple[list[EmbedRequest], dict[str, ErrorCode]]:
    """The jobs set: requests that run, and requests refused with their code."""
    tokenizer = encoder.model.tokenizer
    ids = list(tokenizer.encode("token ids, run as given"))
    good = [
        EmbedRequest(id="text", input="The quick brown fox jumps over the lazy dog."),
        EmbedRequest(id="list", input=["Kafka", "a log of records", "Gemma 3", "embeddings"]),
        EmbedRequest(id="ids", input=[ids, ids[:4]]),
        EmbedRequest(id="one-ids", input=ids),
        EmbedRequest(id="dims", input=["Matryoshka", "truncation"], dimensions=256),
        EmbedRequest(id="b64", input=["base64, as OpenAI sends it"], encoding_format="base64"),
        EmbedRequest(id="query", input="what keeps records in order?", prompt_name="query"),
        EmbedRequest(
            id="document",
            input="Kafka keeps records in order.",
            prompt_name="document",
            metadata={"k": "v"},
        ),
        EmbedRequest(id="cut", input=[LONG, "short"], truncate="end"),
    ]
    bad = {
        "bad-dims": (EmbedRequest(id="bad-dims", input="x", dimensions=4096),
                     ErrorCode.INVALID_DIMENSIONS),
        "bad-prompt": (EmbedRequest(id="bad-prompt", input="x", prompt_name="poem"),
                       ErrorCode.UNKNOWN_PROMPT_NAME),
        "too-long": (EmbedRequest(id="too-long", input=LONG), ErrorCode.PROMPT_TOO_LONG),
        "oov": (EmbedRequest(id="oov", input=[[2, 10**7]]), ErrorCode.TOKEN_OUT_OF_VOCABULARY),
        "empty": (EmbedRequest(id="empty", input=["a", ""]), ErrorCode.EMPTY_PROMPT),
        "mixed": (EmbedRequest(id="mixed", input=["a", [5, 6]]), ErrorCode.INVALID_PROMPT),
    }  # fmt: skip
    return good + [r for r, _ in bad.values()], {k: code for k, (_, code) in bad.items()}


async def test_a_jobs_set_is_answered_once_each_with_unit_vectors(
    kafka_bootstrap: str, encoder: Any
) -> None:
    lane = await new_lane(kafka_bootstrap, partitions=2)
    requests, refused = jobs(encoder)
    generate = GenerateRequest(id="generate", prompt="Hello", max_new_tokens=4)
    headed = EmbedRequest(id="headed", input="sent with its schema header")
    async with running_worker(lane.worker_config(), encoder) as worker:
        await produce_embeds(lane, requests)
        await produce_embeds(lane, [headed], headers=EMBED_HEADER)
        await produce(lane.bootstrap, lane.requests, [generate, b"{not json"])
        wanted = {r.id for r in requests} | {"generate", "headed", ""}
        found = await answers(lane, wanted)
        await wait_committed_to_end(lane)
        assert worker.supervisor.exit_code == 0 and not worker.supervisor.down
        status = worker.supervisor.status()  # what its events say of the model
        assert status.model.task == "embed" and status.model.name == "embeddinggemma-300m"
        assert status.max_model_len == encoder.embedding.max_tokens
    assert {i: len(r) for i, r in found.items() if len(r) != 1} == {}, "each answered once"
    by_id = {i: results[0] for i, results in found.items()}

    for request in requests:
        result = by_id[request.id]
        assert isinstance(result, EmbedResult), request.id
        if request.id in refused:
            assert result.error is not None and result.error.code is refused[request.id]
            assert result.data == []
            continue
        got = vectors(result)
        assert len(got) == (1 if isinstance(request.input, str) or request.id == "one-ids"
                            else len(request.input or []))  # fmt: skip
        width = request.dimensions or encoder.embedding.dimensions
        assert result.dimensions == width and all(v.shape == (width,) for v in got)
        assert all(abs(float(np.linalg.norm(v)) - 1) < 1e-4 for v in got), request.id
        assert result.model is not None and result.model.task == "embed"
        assert result.usage.prompt_tokens > 0 and result.timings.total_ms > 0

    # The worker's vectors are the engine's own, batched or alone.
    (text,) = vectors(by_id["text"])
    assert cosine(text, direct(encoder, "The quick brown fox jumps over the lazy dog.")) > 0.9999
    (query,) = vectors(by_id["query"])
    assert cosine(query, direct(encoder, "what keeps records in order?", "query")) > 0.9999
    assert cosine(query, direct(encoder, "what keeps records in order?")) < 0.9999
    first = vectors(by_id["dims"])[0]
    assert cosine(first, direct(encoder, "Matryoshka", dims=256)) > 0.9999
    cut = by_id["cut"]
    assert isinstance(cut, EmbedResult) and cut.truncated == 1
    assert cut.usage.prompt_tokens <= encoder.embedding.max_tokens + 16
    assert by_id["document"].metadata == {"k": "v"}
    assert isinstance(by_id["headed"], EmbedResult) and by_id["headed"].ok

    wrong_task = by_id["generate"]
    assert isinstance(wrong_task, GenerateResult) and wrong_task.error is not None
    assert wrong_task.error.code is ErrorCode.UNSUPPORTED_TASK
    garbage = by_id[""]
    assert garbage.error is not None and garbage.error.code is ErrorCode.INVALID_JSON
    letters = await read_all(lane.bootstrap, lane.dlq, until=1)
    assert [x.value for x in letters] == [b"{not json"], "only the undecodable record"


async def test_tokenmill_worker_serves_the_embedding_model_by_its_alias(
    kafka_bootstrap: str, embeddinggemma_dir: Path, tmp_path: Path
) -> None:
    lane = await new_lane(kafka_bootstrap, partitions=1)
    requests = [EmbedRequest(id=f"cli-{i}", input=f"text {i}", dimensions=128) for i in range(3)]
    await produce_embeds(lane, requests)
    worker = WorkerProcess(lane, "embeddinggemma-300m", tmp_path / "worker.log").start()
    try:
        found = await answers(lane, {r.id for r in requests}, within_s=600)
        await wait_committed_to_end(lane, within_s=60)
    finally:
        code = worker.terminate()
    assert code == 0, worker.log()[-3000:]
    for request in requests:
        (result,) = found[request.id]
        (vector,) = vectors(result)
        assert vector.shape == (128,) and abs(float(np.linalg.norm(vector)) - 1) < 1e-4


async def test_exactly_once_answers_each_embedding_request_once(
    kafka_bootstrap: str, encoder: Any
) -> None:
    lane = await new_lane(kafka_bootstrap, partitions=2)
    requests = [EmbedRequest(id=f"e{i}", input=[f"record {i}", f"value {i}"]) for i in range(12)]
    config = lane.worker_config(exactly_once=True, session_timeout_ms=6000)
    async with running_worker(config, encoder):
        await produce_embeds(lane, requests)
        found = await answers(lane, {r.id for r in requests}, isolation="read_committed")
        await wait_committed_to_end(lane)
    assert sorted(found) == sorted(r.id for r in requests)
    for results in found.values():
        (result,) = results
        assert len(vectors(result)) == 2


async def test_an_embedding_request_to_a_generative_worker_is_unsupported(
    kafka_bootstrap: str, tiny_checkpoints: dict[str, Path]
) -> None:
    lane = await new_lane(kafka_bootstrap, partitions=1)
    engine = Engine(load_model(tiny_checkpoints["llama"], name="tiny"), EngineConfig())
    embed = EmbedRequest(id="embed", input="hello", metadata={"k": "v"})
    generate = GenerateRequest(id="generate", prompt_token_ids=[5, 6, 7], max_new_tokens=2)
    async with running_worker(lane.worker_config(), engine):
        await produce_embeds(lane, [embed])
        await produce(lane.bootstrap, lane.requests, [generate])
        found = await answers(lane, {"embed", "generate"}, within_s=120)
        await wait_committed_to_end(lane)
    (refused,) = found["embed"]
    assert isinstance(refused, EmbedResult) and refused.error is not None
    assert refused.error.code is ErrorCode.UNSUPPORTED_TASK
    assert refused.metadata == {"k": "v"} and refused.model is None
    (ran,) = found["generate"]
    assert isinstance(ran, GenerateResult) and ran.error is None and len(ran.token_ids) == 2
    assert await read_all(lane.bootstrap, lane.dlq, until=1, within_s=2) == []
