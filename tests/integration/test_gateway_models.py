"""`GET /v1/models` against a real broker and a real worker subprocess: a worker killed
without a `worker_stopped` leaves the list once its consumer is out of the requests' group."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from aiokafka.admin import AIOKafkaAdminClient

from actors.kafka.connection import KafkaConnection
from ops.gateway.fleet import group_workers
from ops.gateway.keys import KeyCheck
from ops.gateway.server import gateway_server
from ops.gateway.settings import GatewaySettings
from ops.services.topics import create_topics
from tests.integration.pipeline import WorkerProcess, new_lane

T = TypeVar("T")

# A killed worker stays a group member for its session timeout (the worker's 10 s default),
# then leaves the list at the next --models-refresh; the rest is room for a slow machine.
WITHIN_S = 120.0


async def test_a_worker_killed_without_a_word_leaves_the_models_listed(
    kafka_bootstrap: str, tiny_checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    lane = await new_lane(kafka_bootstrap)
    prefix = lane.requests.removesuffix(".requests")
    names = {role: f"{prefix}.{role}" for role in ("events", "control", "cancel")}
    await create_topics(kafka_bootstrap, names=names)
    model, worker_id = str(tiny_checkpoints["llama"]), f"{prefix}-worker"
    extra = [
        "--events-topic", names["events"], "--control-topic", names["control"],
        "--worker-id", worker_id,
    ]  # fmt: skip
    worker = WorkerProcess(lane, model, tmp_path / "worker.log", extra=extra).start()
    settings = GatewaySettings(
        port=0,
        requests_topic=lane.requests,
        cancel_topic=names["cancel"],
        events_topic=names["events"],
        group=lane.group,
        models_refresh=1.0,
        batch_dir=str(tmp_path / "batches"),
    )
    server = gateway_server(settings, KafkaConnection(kafka_bootstrap), KeyCheck(()))
    serving = asyncio.create_task(server.serve())
    try:
        await worker.wait_for_log("ingest_started", within_s=300)
        while not server.started:  # uvicorn's own flag: the lifespan ran and it listens
            assert not serving.done(), "the gateway stopped before it started"
            await asyncio.sleep(0.05)
        url = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}/v1/models"

        async def listed() -> list[str]:
            return await asyncio.to_thread(model_ids, url)

        # What the gateway asks the broker names the live worker, as the gateway reads it.
        await until(lambda m: worker_id in m, lambda: members(kafka_bootstrap, lane.group))
        await until(lambda ids: ids == [model], listed)
        worker.kill()
        await until(lambda ids: ids == [], listed)
        assert worker_id not in await members(kafka_bootstrap, lane.group)
    finally:
        worker.close()
        server.should_exit = True
        await serving


def model_ids(url: str) -> list[str]:
    with urllib.request.urlopen(url, timeout=30) as response:
        return [m["id"] for m in json.loads(response.read())["data"]]


async def members(bootstrap: str, group: str) -> set[str]:
    """The worker ids in `group`, read as the gateway reads them."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return group_workers(await admin.describe_consumer_groups([group]))
    finally:
        await admin.close()


async def until(done: Callable[[T], bool], read: Callable[[], Awaitable[T]]) -> T:
    """`read()` once `done` holds for it; the deadline only bounds a hang."""
    deadline = time.monotonic() + WITHIN_S
    while not done(value := await read()):
        assert time.monotonic() < deadline, f"still {value!r} after {WITHIN_S} s"
        await asyncio.sleep(0.2)
    return value
