"""`POST /v1/embeddings` with the official `openai` SDK before a real worker serving
EmbeddingGemma-300M on the session broker: floats and the SDK's default base64 give the same
vectors, `dimensions` cuts and renormalizes, a list is answered once per input, in order, as
each input alone; the models list says the model embeds, and each door refuses the other
task. The gateway's Batch API runs a file of `/v1/embeddings` lines, each answered once.

EmbeddingGemma runs a few texts a second on a busy 2-core CPU: texts are few and short."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest

from messages.openai_batch import EMBEDDINGS_URL
from messages.request import GenerateRequest
from ops.submit.client import SubmitClient
from tests.integration.gateway_fleet import Fleet, client, gateway, serving

pytestmark = pytest.mark.slow

WIDTH = 768  # EmbeddingGemma-300M's vectors
TEXTS = ["Kafka keeps the order of a partition.", "Die Katze schläft 😴", "def f(x): return x"]


@pytest.fixture(scope="module")
def embedder(
    kafka_bootstrap: str, embeddinggemma_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    """One worker serving EmbeddingGemma-300M, for every test of this module."""
    folder = tmp_path_factory.mktemp("embeddings")
    with serving(kafka_bootstrap, "embeddinggemma-300m", folder) as served:
        asyncio.run(served.worker.wait_for_log(("cancel_ready", "cancel_started"), within_s=300))
        yield served


async def embedding_model(api: openai.AsyncOpenAI) -> str:
    """The name the fleet lists the embedding model under (its card says `task: embed`)."""
    deadline = time.monotonic() + 60
    while True:
        cards = (await api.models.list()).data
        found = [m.id for m in cards if (m.model_extra or {}).get("task") == "embed"]
        if found:
            return found[0]
        assert time.monotonic() < deadline, cards
        await asyncio.sleep(0.2)  # the worker's `worker_started` is on its way


def unit(vector: list[float]) -> np.ndarray:
    array = np.asarray(vector, dtype=np.float64)
    assert abs(float(np.linalg.norm(array)) - 1.0) < 1e-4  # the model's pipeline normalizes
    return array


async def test_floats_base64_dimensions_and_a_list_through_the_sdk(embedder: Fleet) -> None:
    async with gateway(embedder) as base, client(base) as api:
        model = await embedding_model(api)
        floats = await api.embeddings.create(model=model, input=TEXTS[0], encoding_format="float")
        default = await api.embeddings.create(model=model, input=TEXTS[0])  # base64, decoded
        cut = await api.embeddings.create(
            model=model, input=TEXTS[0], encoding_format="float", dimensions=256
        )
        listed = await api.embeddings.create(model=model, input=TEXTS, encoding_format="float")
        raw = await api.embeddings.with_raw_response.create(
            model=model, input=TEXTS[1], encoding_format="base64"
        )

    [one] = floats.data
    assert (floats.object, floats.model, one.index, len(one.embedding)) == ("list", model, 0, WIDTH)
    assert floats.usage.prompt_tokens == floats.usage.total_tokens > 0
    full = unit(one.embedding)
    # The SDK asked base64 (no format named) and decoded it: float32, little-endian.
    assert np.array_equal(np.float32(default.data[0].embedding), np.float32(one.embedding))
    # Matryoshka: the first 256 values, normalized again.
    assert len(cut.data[0].embedding) == 256
    assert np.allclose(
        unit(cut.data[0].embedding), full[:256] / np.linalg.norm(full[:256]), atol=1e-5
    )
    # A list: one vector per input, in order, each as the input alone gets it.
    assert [d.index for d in listed.data] == list(range(len(TEXTS)))
    assert float(unit(listed.data[0].embedding) @ full) > 0.9999
    assert listed.usage.prompt_tokens > floats.usage.prompt_tokens
    named = raw.parse().data[0].embedding  # format named: the SDK leaves the string as it is
    assert isinstance(named, str)
    values = np.frombuffer(base64.b64decode(named), dtype="<f4")
    assert np.allclose(values, listed.data[1].embedding, atol=1e-6)
    assert raw.headers["x-request-id"].startswith("gw-") and raw.headers["x-tokenmill-worker"]


async def test_many_inputs_come_back_whole_and_in_order(embedder: Fleet) -> None:
    """More inputs than one result record holds as floats (LangChain sends 1,000 at a time):
    the gateway sends them in parts and joins the answers."""
    texts = [f"note {n}: {TEXTS[n % len(TEXTS)]}" for n in range(300)]
    async with gateway(embedder) as base, client(base) as api:
        model = await embedding_model(api)
        alone = await api.embeddings.create(model=model, input=texts[257], encoding_format="float")
        many = await api.embeddings.create(model=model, input=texts, encoding_format="float")
    assert [d.index for d in many.data] == list(range(len(texts)))
    assert all(len(d.embedding) == WIDTH for d in many.data)
    assert float(unit(many.data[257].embedding) @ unit(alone.data[0].embedding)) > 0.9999


async def test_task_prompts_and_token_ids_reach_the_worker(embedder: Fleet) -> None:
    async with gateway(embedder) as base, client(base) as api:
        model = await embedding_model(api)
        plain, query = [
            await api.embeddings.create(
                model=model, input="capital of France", encoding_format="float", extra_body=extra
            )
            for extra in ({}, {"prompt_name": "query"})
        ]
        ids = await api.embeddings.create(model=model, input=[[2, 9259, 1], [2, 1]])
        with pytest.raises(openai.BadRequestError) as unknown:
            await api.embeddings.create(
                model=model, input="x", extra_body={"prompt_name": "no-such-prompt"}
            )
    assert float(unit(plain.data[0].embedding) @ unit(query.data[0].embedding)) < 0.9999
    assert query.usage.prompt_tokens > plain.usage.prompt_tokens  # the prompt's tokens count
    assert [len(d.embedding) for d in ids.data] == [WIDTH, WIDTH]
    assert unknown.value.code == "unknown_prompt_name"


async def test_each_door_refuses_the_other_task(embedder: Fleet) -> None:
    async with gateway(embedder) as base, client(base) as api:
        model = await embedding_model(api)
        assert (await api.models.retrieve(model)).model_extra["task"] == "embed"  # type: ignore[index]
        with pytest.raises(openai.BadRequestError) as chat:
            await api.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=4
            )
        assert chat.value.code == "unsupported_task"
    # Sent straight to the embedding worker, a generation gets the worker's own typed error.
    lane = embedder.lane
    async with SubmitClient(lane.bootstrap, lane.requests, lane.results) as sub:
        await sub.send([GenerateRequest(id="gen-on-embedder", prompt="Hi", max_new_tokens=4)])
        [result] = [r async for r in sub.results({"gen-on-embedder"}, within_s=120)]
    assert result.error is not None and result.error.code == "unsupported_task"


def embeddings_line(custom_id: str, model: str, **body: Any) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": EMBEDDINGS_URL,
            "body": {"model": model, **body}}  # fmt: skip


async def test_a_batch_of_embeddings_lines_answers_each_once(embedder: Fleet) -> None:
    async with gateway(embedder) as base, client(base) as api:
        model = await embedding_model(api)
        lines = [embeddings_line(f"d{n}", model, input=f"document number {n}") for n in range(6)]
        lines.append(embeddings_line("pair", model, input=TEXTS[:2], dimensions=128))
        lines.append(embeddings_line("empty", model, input=""))  # its error line
        data = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
        uploaded = await api.files.create(file=("emb.jsonl", data), purpose="batch")
        batch = await api.batches.create(
            input_file_id=uploaded.id, endpoint=EMBEDDINGS_URL, completion_window="24h"
        )
        deadline = time.monotonic() + 600
        while (batch := await api.batches.retrieve(batch.id)).status not in (
            "completed", "failed", "cancelled", "expired",
        ):  # fmt: skip
            assert time.monotonic() < deadline, batch
            await asyncio.sleep(0.2)  # the next look at the batch's progress
        assert batch.status == "completed", batch
        assert batch.output_file_id is not None and batch.error_file_id is not None
        answers = [
            json.loads(x)
            for x in (await api.files.content(batch.output_file_id)).content.splitlines()
        ]
        errors = [
            json.loads(x)
            for x in (await api.files.content(batch.error_file_id)).content.splitlines()
        ]
        mismatched = await api.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/completions", completion_window="24h"
        )
    ids = sorted(line["custom_id"] for line in answers + errors)
    assert ids == sorted(line["custom_id"] for line in lines)  # each answered once
    by_id = {line["custom_id"]: line["response"]["body"] for line in answers}
    assert all(by_id[f"d{n}"]["object"] == "list" for n in range(6))
    assert [len(d["embedding"]) for d in by_id["pair"]["data"]] == [128, 128]
    assert [(e["response"], e["error"]["code"]) for e in errors] == [(None, "empty_prompt")]
    assert batch.request_counts is not None
    assert (batch.request_counts.completed, batch.request_counts.failed) == (7, 1)
    assert mismatched.status == "failed"  # one endpoint per batch, as OpenAI's
