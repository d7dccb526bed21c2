"""A worker serving an embedding model says so in its events: `ModelRef.task` "embed" and the
longest input it takes as `max_model_len` (what the gateway's model list reads)."""

from __future__ import annotations

import asyncio

from actors.ingest.model_front import ModelFront
from messages.events import WorkerStarted
from tests.unit.actors.fake_encoder import FakeEncoder
from tests.unit.actors.test_supervisor import Rig


async def test_worker_started_and_status_name_an_embedding_model() -> None:
    rig = Rig()
    rig.gpu.front = ModelFront.of_engine(FakeEncoder())
    running = asyncio.create_task(rig.supervisor.run())
    await rig.supervisor.started.wait()
    await rig.all_up()
    (started,) = rig.control.of(WorkerStarted)
    assert started.model.task == "embed" and started.model.name == "fake-embed"
    assert started.max_model_len == 16
    status = rig.supervisor.status()
    assert status.model.task == "embed" and status.max_model_len == 16
    rig.supervisor.drain()
    await running
