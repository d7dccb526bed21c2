"""A drain while a dead letter is blocked (the DLQ refuses it, even trimmed) exits 0, promptly,
committing up to the blocked record and not past it: the emitter tells the ingest
(`OutcomeBlocked`), whose drain waits for every other outcome only, says which offset stays
uncommitted (`offset_left_uncommitted`), and the emitter gives the letter up at its stop.
A drain that waited for it would wait out its whole grace (900 s here) and exit 1."""

from __future__ import annotations

import asyncio
from pathlib import Path

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from structlog.testing import capture_logs

from actors.ingest.model_front import ModelFront
from actors.worker import Worker
from gpu.engine import Engine
from gpu.engine_config import EngineConfig
from gpu.loading.loader import load_model
from messages.request import GenerateRequest
from tests.integration.pipeline import committed, new_lane, produce, results_by_id


async def _refuse_every_dead_letter(bootstrap: str, dlq: str) -> None:
    """The DLQ takes no record batch over 64 bytes: not even a letter trimmed to its headers."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.alter_configs(
            [ConfigResource(ConfigResourceType.TOPIC, dlq, configs={"max.message.bytes": "64"})]
        )
    finally:
        await admin.close()


async def test_a_drain_with_a_blocked_dead_letter_exits_0_committing_up_to_it(
    kafka_bootstrap: str, tiny_checkpoints: dict[str, Path]
) -> None:
    lane = await new_lane(kafka_bootstrap, partitions=1)
    await _refuse_every_dead_letter(lane.bootstrap, lane.dlq)
    engine = Engine(load_model(tiny_checkpoints["llama"], name="tiny"), EngineConfig())
    # A grace far longer than the test may take: waiting it out would hang the test.
    worker = Worker(
        lane.worker_config(shutdown_timeout_s=900), engine, ModelFront.of_engine(engine)
    )
    good = [
        GenerateRequest(id=request_id, prompt_token_ids=[5, 6, 7], max_new_tokens=2)
        for request_id in ("before", "after")
    ]
    with capture_logs() as logs:
        task = asyncio.create_task(worker.run())
        try:
            await worker.started.wait()
            # Offsets 0, 1 (not JSON: answered, and its dead letter refused), 2.
            await produce(lane.bootstrap, lane.requests, [good[0], b"{not json", good[1]])
            found = await results_by_id(lane, ["before", "after"])
            assert all(found[i][0].error is None for i in ("before", "after"))
            deadline = asyncio.get_running_loop().time() + 120  # bounds a hang only
            while not worker.emitter.blocked:
                assert asyncio.get_running_loop().time() < deadline, "no dead letter blocked"
                await asyncio.sleep(0.05)
        finally:
            worker.drain()
            await asyncio.wait_for(task, 120)  # not the 900 s grace
    assert worker.supervisor.exit_code == 0
    assert await committed(lane) == {0: 1}, "up to the blocked record, not past it"
    (left,) = [e for e in logs if e["event"] == "offset_left_uncommitted"]
    assert (left["partition"], left["offset"]) == (0, 1)
    (abandoned,) = [e for e in logs if e["event"] == "dead_letter_abandoned"]
    assert (abandoned["partition"], abandoned["offset"]) == (0, 1)
    assert "drain_stuck" not in [e["event"] for e in logs]
