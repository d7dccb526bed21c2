"""The wire format is the contract: a client that is not tokenmill's (librdkafka through
confluent-kafka) produces a request as plain JSON and reads the result."""

from __future__ import annotations

import asyncio
import json
import time

from confluent_kafka import Consumer, Producer

from gpu.engine import Engine
from gpu.engine_config import EngineConfig
from gpu.loading.loader import load_model
from tests.integration.pipeline import new_lane, running_worker


def produce_plain_json(bootstrap: str, topic: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    body = {"id": "foreign-1", "prompt_token_ids": [5, 6, 7], "max_new_tokens": 4,
            "metadata": {"team": "search"}}  # fmt: skip
    producer.produce(topic, key=b"foreign-1", value=json.dumps(body).encode())
    assert producer.flush(30) == 0


def read_one(bootstrap: str, topic: str, within_s: float = 60) -> tuple[dict, dict]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{topic}",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic])
    try:
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None or message.error():
                continue
            headers = {k: v.decode() for k, v in message.headers() or []}
            return json.loads(message.value()), headers
    finally:
        consumer.close()
    raise AssertionError("no result within the time limit")


async def test_a_librdkafka_client_round_trips(kafka_bootstrap, tiny_checkpoints) -> None:
    lane = await new_lane(kafka_bootstrap, partitions=1)
    engine = Engine(load_model(tiny_checkpoints["llama"], name="tiny"), EngineConfig())
    async with running_worker(lane.worker_config(), engine):
        await asyncio.to_thread(produce_plain_json, lane.bootstrap, lane.requests)
        result, headers = await asyncio.to_thread(read_one, lane.bootstrap, lane.results)

    assert result["id"] == "foreign-1"
    assert result["error"] is None
    assert len(result["token_ids"]) == 4 and result["finish_reason"] == "length"
    assert result["usage"] == {
        "prompt_tokens": 3,
        "completion_tokens": 4,
        "total_tokens": 7,
        "cached_tokens": 0,  # prompt tokens the prefix cache served (none: the first request)
        "accepted_draft_tokens": 0,  # speculative decoding's guesses kept (none: it is off)
        "rejected_draft_tokens": 0,
    }
    assert result["metadata"] == {"team": "search"}
    assert result["model"]["name"] == "tiny"
    assert headers["content-type"] == "application/json"
    assert headers["tokenmill-schema"] == "GenerateResult/1"
