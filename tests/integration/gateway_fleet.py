"""A gateway in front of one real SmolLM2 worker, for the gateway's integration tests.

fleet          a module-scoped fixture: the worker and its topics on the session broker
serving(...)   the same for any model (a context manager)
gateway(fleet) an async context: a gateway serving in this process; its base URL
client(url)    the official `openai` SDK's async client for it
direct_text    the worker's answer to a body asked straight on Kafka (the same mapping)
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import openai
import pytest

from actors.kafka.connection import KafkaConnection
from ops.gateway.bodies import to_asked
from ops.gateway.keys import KeyCheck
from ops.gateway.server import gateway_server
from ops.gateway.settings import GatewaySettings
from ops.services.topics import create_topics
from ops.submit.client import SubmitClient
from tests.integration.pipeline import Lane, WorkerProcess, new_lane

MODEL = "smollm2-135m"
KEY = "sk-test-gateway"


@dataclass(frozen=True)
class Fleet:
    lane: Lane
    cancel: str
    events: str
    worker: WorkerProcess
    batch_dir: Path  # the in-process gateways' --batch-dir

    def settings(self, **overrides: Any) -> GatewaySettings:
        base = GatewaySettings(
            port=0,
            requests_topic=self.lane.requests,
            cancel_topic=self.cancel,
            events_topic=self.events,
            request_timeout=300.0,
            batch_dir=str(self.batch_dir),
        )
        return replace(base, **overrides)


@pytest.fixture(scope="module")
def fleet(
    kafka_bootstrap: str, smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    """One SmolLM2 worker with cancel and events topics, for every test of this module."""
    with serving(kafka_bootstrap, MODEL, tmp_path_factory.mktemp("gateway")) as served:
        asyncio.run(served.worker.wait_for_log(("cancel_ready", "cancel_started"), within_s=300))
        yield served


@contextmanager
def serving(kafka_bootstrap: str, model: str, folder: Path) -> Iterator[Fleet]:
    """A worker serving `model` (a name or a path) on topics of its own (requests, results,
    cancel, events, control), its log and batches in `folder`; closed after the block."""

    async def topics() -> tuple[Lane, str, str]:
        lane = await new_lane(kafka_bootstrap)
        prefix = lane.requests.removesuffix(".requests")
        cancel, events = f"{prefix}.cancel", f"{prefix}.events"
        names = {"cancel": cancel, "events": events, "control": f"{prefix}.control"}
        await create_topics(kafka_bootstrap, names=names)
        return lane, cancel, events

    lane, cancel, events = asyncio.run(topics())
    extra = [
        "--cancel-topic", cancel,
        "--events-topic", events,
        "--control-topic", f"{lane.requests.removesuffix('.requests')}.control",
        # What a body without max_tokens runs to (the tests ask 400 at most): to the context's
        # end a greedy answer took 294 s of the client's 300 s on a busy machine
        "--max-new-tokens-limit", "512",
    ]  # fmt: skip
    worker = WorkerProcess(lane, model, folder / "worker.log", extra=extra).start()
    try:
        asyncio.run(worker.wait_for_log("ingest_started", within_s=300))
        yield Fleet(lane, cancel, events, worker, folder / "batches")
    finally:
        worker.close()


@asynccontextmanager
async def gateway(
    fleet: Fleet, *, keys: tuple[bytes, ...] = (), **overrides: Any
) -> AsyncIterator[str]:
    """A gateway serving in this process; its base URL (`http://127.0.0.1:PORT/v1`)."""
    server = gateway_server(
        fleet.settings(**overrides), KafkaConnection(fleet.lane.bootstrap), KeyCheck(keys)
    )
    task = asyncio.create_task(server.serve())
    while not server.started:  # uvicorn's own flag: the lifespan ran and it listens
        if task.done():
            task.result()
            raise AssertionError("the gateway stopped before it started")
        await asyncio.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        await task


def client(base_url: str, key: str = KEY) -> openai.AsyncOpenAI:
    """The SDK's async client (the gateway shares this event loop); `async with` it."""
    return openai.AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=300)


async def direct_text(fleet: Fleet, url: str, body: dict[str, Any]) -> str:
    """The worker's answer to `body` asked straight on Kafka (the same mapping)."""
    request = to_asked(url, body, f"direct-{uuid.uuid4().hex[:8]}").request
    async with SubmitClient(fleet.lane.bootstrap, fleet.lane.requests, fleet.lane.results) as sub:
        await sub.send([request])
        results = [r async for r in sub.results({request.id}, within_s=300)]
    [result] = results
    assert result.ok, result.error
    return result.text
