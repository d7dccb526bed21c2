"""All four serving features at once through one real worker on SmolLM2: requests sharing a
system prompt (prefix caching), JSON-schema requests, streamed requests and a cancelled one,
interleaved with ordinary requests. Every request is answered exactly once, the ordinary
outputs are what the engine makes alone, schemas validate, chunks add up to their results,
the cancelled request stops with what it made so far, and the shared prompt is served from
the cache."""

from __future__ import annotations

import json
import uuid
from collections import defaultdict
from typing import Any

import jsonschema
import msgspec
import pytest

from messages import headers as h
from messages.chunk import GenerateChunk
from messages.codec import Codec
from messages.request import ChatMessage, GenerateRequest
from messages.result import FinishReason, GenerateResult
from tests.integration.pipeline import produce, results_by_id, wait_committed_to_end
from tests.integration.test_cancel import (
    COUNTING,
    cancel_lane,
    decoding,
    once,
    reference,
    running,
    send_cancel,
    smollm2,  # noqa: F401 (a fixture)
    until,
)
from tests.integration.test_prefix_caching_worker import SYSTEM
from tests.integration.test_streaming import ctype, replies
from tests.integration.test_structured_output import SCHEMAS, json_schema

pytestmark = pytest.mark.slow

chunk_codec = Codec(GenerateChunk)
result_codec = Codec(GenerateResult)


def shared(request_id: str, question: str, **fields: Any) -> GenerateRequest:
    messages = [
        ChatMessage(role="system", content=SYSTEM),
        ChatMessage(role="user", content=question),
    ]
    return GenerateRequest(id=request_id, messages=messages, **{"max_new_tokens": 12, **fields})


async def test_all_serving_features_interleaved_with_ordinary_requests(
    kafka_bootstrap: str,
    smollm2: Any,  # noqa: F811
) -> None:
    tag = uuid.uuid4().hex[:6]
    long = GenerateRequest(id=f"long-{tag}", prompt=COUNTING, max_new_tokens=1000)
    first = shared(f"shared-0-{tag}", "When do you open on Sunday?")
    wave = [
        GenerateRequest(id=f"plain-0-{tag}", prompt="The capital of France is", max_new_tokens=8),
        shared(f"shared-1-{tag}", "Are you open on Monday?", stream=True),
        GenerateRequest(
            id=f"json-city-{tag}", prompt="A city, as JSON:", max_new_tokens=40,
            response_format=json_schema(SCHEMAS["city"]),
        ),
        shared(
            f"shared-2-{tag}", "Your hours, as JSON.", max_new_tokens=40,
            response_format=json_schema(SCHEMAS["nested"]),
        ),
        GenerateRequest(
            id=f"stream-{tag}", prompt="Two plus two is", max_new_tokens=10, stream=True,
            stream_interval_tokens=2,
        ),
        GenerateRequest(id=f"plain-1-{tag}", prompt="Three words for tea:", max_new_tokens=8),
    ]  # fmt: skip
    everyone = [long, first, *wave]
    lane, topic = await cancel_lane(kafka_bootstrap, partitions=2)
    async with running(lane, topic, smollm2) as run:
        await produce(lane.bootstrap, lane.requests, [long, first])
        await results_by_id(lane, [first.id], within_s=300)  # the system prompt is cached now
        await produce(lane.bootstrap, lane.requests, wave)
        await until(lambda: decoding(run.worker, long.id, 2), "the long request decodes")
        await send_cancel(lane, topic, long.id)
        records = await replies(lane, {r.id for r in everyone})
        await wait_committed_to_end(lane)

    results: dict[str, list[GenerateResult]] = defaultdict(list)
    chunks: dict[str, list[GenerateChunk]] = defaultdict(list)
    for record in records:
        if h.header(record.headers, h.SCHEMA) == h.CHUNK_SCHEMA.encode():
            chunk = chunk_codec.decode(record.value or b"", ctype(record))
            chunks[chunk.id].append(chunk)
        else:
            result = result_codec.decode(record.value or b"", ctype(record))
            results[result.id].append(result)
    final = once(dict(results))  # exactly one result each
    assert set(final) == {r.id for r in everyone}
    assert all(r.error is None for r in final.values()), final

    # Ordinary and streamed requests make what the engine makes for them alone.
    for request in (wave[0], wave[5], wave[1], wave[4], first):
        assert final[request.id].token_ids == reference(smollm2, request), request.id
    # Streamed ones: chunks in order, adding up to the result.
    assert set(chunks) == {wave[1].id, wave[4].id}
    for request_id, own in chunks.items():
        assert [c.seq for c in own] == list(range(len(own)))
        assert "".join(c.text for c in own) == final[request_id].text
    # Schemas: a stopped output is complete JSON that validates.
    for request, schema in ((wave[2], SCHEMAS["city"]), (wave[3], SCHEMAS["nested"])):
        result = final[request.id]
        assert result.finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
        if result.finish_reason is FinishReason.STOP:
            jsonschema.validate(json.loads(result.text), schema)
    # The cancelled one: what it made is what it would have made.
    stopped = final[long.id]
    assert stopped.finish_reason is FinishReason.CANCELLED
    assert 2 <= len(stopped.token_ids) < long.max_new_tokens
    made = msgspec.structs.replace(long, max_new_tokens=len(stopped.token_ids))
    assert stopped.token_ids == reference(smollm2, made)
    # The shared system prompt, computed once, served the later ones from the cache.
    assert final[first.id].usage.cached_tokens == 0
    for request in (wave[1], wave[3]):
        assert final[request.id].usage.cached_tokens >= 96, request.id
    assert final[wave[0].id].usage.cached_tokens == 0
