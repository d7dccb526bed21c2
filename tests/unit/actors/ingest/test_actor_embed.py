"""IngestActor with an embedding model's front (a fake consumer, no broker): embedding records
told apart by header or body, tokenized into batches; each task refused by the other's model
with `unsupported_task`; an undecodable embedding record dead-lettered, answered in kind."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, cast

from actors.config import WorkerConfig
from actors.ingest.actor import IngestActor
from actors.ingest.model_front import EmbedInputs, ModelFront
from actors.mail import Batch, Cancel, Outcome
from actors.runtime import Mailbox
from messages import headers as h
from messages.embedding import EmbedRequest, EmbedResult
from messages.error_codes import ErrorCode
from messages.request import GenerateRequest
from messages.result import GenerateResult
from tests.unit.actors.fake_encoder import FakeEncoder
from tests.unit.actors.ingest.test_actor import TP, WITHIN_S, Lane, codec
from tests.unit.actors.kafka.fake_consumer import FakeConsumer, record

EMBED_HEADER = [(h.SCHEMA, h.EMBED_REQUEST_SCHEMA.encode())]
GENERATIVE = ModelFront(
    name="gen", digest="d", aliases=frozenset({"gen"}), tokenizer=cast(Any, None),
    vocab_size=64, max_model_len=64, max_prompt_tokens=32, max_new_tokens=16,
)  # fmt: skip


@asynccontextmanager
async def running(records: list[Any], front: ModelFront) -> AsyncIterator[Lane]:
    config = WorkerConfig(requests_topic=TP.topic, results_topic="lane.results",
                          dlq_topic="lane.dlq")  # fmt: skip
    consumer = FakeConsumer([TP], records)
    batches: Mailbox[Batch | Cancel] = Mailbox(64)
    outcomes: Mailbox[Outcome] = Mailbox(64)
    ingest = IngestActor(
        config, front, batches=batches, outcomes=outcomes, consumer=lambda: cast(Any, consumer)
    )
    async with asyncio.timeout(WITHIN_S):
        task = asyncio.create_task(ingest.run())
        try:
            yield Lane(ingest, consumer, batches, outcomes)
        finally:
            ingest.stop()
            await task


def embed_record(offset: int, body: bytes, headers: list[Any] | None = None) -> Any:
    return record(TP, offset, body, headers or [])


async def test_embedding_records_by_header_or_body_are_tokenized_into_a_batch() -> None:
    front = ModelFront.of_engine(FakeEncoder())
    records = [
        embed_record(0, b'{"id": "a", "input": ["hi", "there"], "dimensions": 4}'),
        embed_record(1, b'{"id": "b", "input": [[5, 6, 7]]}', EMBED_HEADER),
    ]
    async with running(records, front) as lane:
        items = []
        while len(items) < 2:
            items += (await lane.batch()).items
        first, second = sorted(items, key=lambda i: i.request.id)
        assert isinstance(first.request, EmbedRequest) and first.request.dimensions == 4
        assert isinstance(first.embed, EmbedInputs) and len(first.embed.inputs) == 2
        assert first.prompt_token_ids == first.embed.tokens
        assert first.cost_tokens == len(first.embed.tokens), "max_new_tokens 0: inputs only"
        assert second.embed == EmbedInputs(([5, 6, 7],))
        assert lane.outcomes.empty()
        for item in items:
            await lane.deliver(item.record, admitted=True, cost=item.cost_tokens)


async def test_a_generation_request_to_an_embedding_worker_is_unsupported_not_dead_lettered() -> (
    None
):
    front = ModelFront.of_engine(FakeEncoder())
    generate = codec.encode(GenerateRequest(id="g", prompt="hello", max_new_tokens=2))
    async with running([record(TP, 0, generate)], front) as lane:
        outcome = await lane.outcomes.get()
        assert isinstance(outcome.result, GenerateResult)
        assert outcome.result.error is not None
        assert outcome.result.error.code is ErrorCode.UNSUPPORTED_TASK
        assert outcome.dead_letter is None and lane.batches.empty()
        await lane.deliver(outcome.record)


async def test_an_embedding_request_to_a_generative_worker_is_unsupported() -> None:
    body = b'{"id": "e", "input": "hello", "metadata": {"k": "v"}}'
    async with running([embed_record(0, body)], GENERATIVE) as lane:
        outcome = await lane.outcomes.get()
        assert isinstance(outcome.result, EmbedResult)
        assert outcome.result.error is not None
        assert outcome.result.error.code is ErrorCode.UNSUPPORTED_TASK
        assert (outcome.result.id, outcome.result.metadata) == ("e", {"k": "v"})
        assert outcome.dead_letter is None
        await lane.deliver(outcome.record)


async def test_a_malformed_embedding_request_gets_its_typed_error_in_kind() -> None:
    front = ModelFront.of_engine(FakeEncoder())
    records = [
        embed_record(0, b'{"id": "d", "input": "x", "dimensions": 99}'),
        embed_record(1, b'{"id": "n", "input": [["x"]]}'),
        embed_record(2, b'{"id": "s", "input": "x", "truncate": "middle"}', EMBED_HEADER),
    ]
    async with running(records, front) as lane:
        found = {}
        for _ in records:
            outcome = await lane.outcomes.get()
            assert isinstance(outcome.result, EmbedResult), outcome.result
            assert outcome.result.error is not None
            found[outcome.result.id] = (outcome.result.error.code, outcome.dead_letter is not None)
            await lane.deliver(outcome.record)
        assert found == {
            "d": (ErrorCode.INVALID_DIMENSIONS, False),
            "n": (ErrorCode.INVALID_PROMPT, False),
            "s": (ErrorCode.SCHEMA_VIOLATION, True),  # undecodable: the record to the DLQ
        }


async def test_an_undecodable_record_is_dead_lettered_as_it_always_was() -> None:
    front = ModelFront.of_engine(FakeEncoder())
    async with running([record(TP, 0, b"{not json")], front) as lane:
        outcome = await lane.outcomes.get()
        assert isinstance(outcome.result, GenerateResult)
        assert outcome.result.error is not None
        assert outcome.result.error.code is ErrorCode.INVALID_JSON
        assert outcome.dead_letter is not None and outcome.dead_letter.value == b"{not json"
        await lane.deliver(outcome.record)
