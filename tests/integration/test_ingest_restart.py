"""A drain after an ingest crash exits 0, promptly, with its final commit.

The crashed ingest had records read and not answered on partition 0, which another member of
the group holds after the restart. The restarted ingest starts holding nothing
(`IngestActor._forget_partitions`), so its drain waits for none of them; a drain that waited
would wait out its whole grace (900 s here) and exit 1 without the final commit. (In this
order of events the rebalance listener also clears them; the reset does not depend on one.)
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition

from actors.ingest.model_front import ModelFront
from actors.worker import Worker
from gpu.engine import Engine
from gpu.engine_config import EngineConfig
from gpu.loading.loader import load_model
from messages.codec import Codec
from messages.request import GenerateRequest
from tests.integration.pipeline import committed, new_lane, results_by_id


class InjectedCrash(RuntimeError):
    pass


async def _produce_to(bootstrap: str, topic: str, partition: int, ids: list[str]) -> None:
    codec = Codec(GenerateRequest)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for i, request_id in enumerate(ids):
            request = GenerateRequest(
                id=request_id, prompt_token_ids=[5 + i, 6, 7], max_new_tokens=2
            )
            await producer.send_and_wait(
                topic, codec.encode(request), key=request_id.encode(), partition=partition
            )
    finally:
        await producer.stop()


async def test_a_drain_after_an_ingest_crash_exits_0_with_its_final_commit(
    kafka_bootstrap: str, tiny_checkpoints: dict[str, Path]
) -> None:
    lane = await new_lane(kafka_bootstrap, partitions=2)
    engine = Engine(load_model(tiny_checkpoints["llama"], name="tiny"), EngineConfig())
    # A grace far longer than the test may take: waiting it out would hang the test.
    config = lane.worker_config(shutdown_timeout_s=900)
    worker = Worker(config, engine, ModelFront.of_engine(engine))
    # Another member of the group, which sorts first: once it has joined, partition 0 is its.
    squatter = AIOKafkaConsumer(
        lane.requests,
        bootstrap_servers=lane.bootstrap,
        group_id=lane.group,
        client_id="aaa-squatter",
        enable_auto_commit=False,
    )
    ingest = worker.ingest
    real_bucket = ingest._bucket
    crashed = asyncio.Event()

    async def crash_once(accepted: list[Any]) -> None:
        """The first time: leave partition 0's records read and unanswered, let the squatter
        join (taking partition 0 at the next rebalance), then crash."""
        if crashed.is_set():
            await real_bucket(accepted)
            return
        crashed.set()
        await squatter.start()
        raise InjectedCrash("the ingest crashes with partition 0's records in flight")

    ingest._bucket = crash_once  # type: ignore[method-assign]
    task = asyncio.create_task(worker.run())
    try:
        await worker.started.wait()
        await _produce_to(lane.bootstrap, lane.requests, 0, ["p0-a", "p0-b"])
        await asyncio.wait_for(crashed.wait(), 120)
        # The restarted ingest holds partition 1 only; what it reads there is answered.
        only_p1 = {TopicPartition(lane.requests, 1)}
        deadline = asyncio.get_running_loop().time() + 120  # bounds a hang only
        while not (ingest.joined and ingest.consumer and held(ingest.consumer) == only_p1):
            assert asyncio.get_running_loop().time() < deadline, "never held partition 1 alone"
            await asyncio.sleep(0.05)
        await _produce_to(lane.bootstrap, lane.requests, 1, ["p1-a", "p1-b"])
        found = await results_by_id(lane, ["p1-a", "p1-b"])
        assert all(found[i][0].error is None for i in ("p1-a", "p1-b"))
    finally:
        worker.drain()
        await asyncio.wait_for(task, 120)  # not the 900 s grace
        await squatter.stop()
    assert worker.supervisor.policy.total() == 1, "the ingest was restarted once"
    assert worker.supervisor.exit_code == 0
    done = await committed(lane)
    assert done.get(1) == 2, f"the final commit covers partition 1's records: {done}"


def held(consumer: Any) -> set[TopicPartition]:
    """The requests topic's partitions a consumer holds (its retry topics' are assigned too)."""
    return {tp for tp in consumer.assignment() if ".retry." not in tp.topic}
