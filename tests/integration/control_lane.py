"""Shared pieces for tests of the control plane against a real broker.

Each test gets its own control and events topics (`ControlLane`) and runs a `ControlActor`
in-process (`running_control`) with a stand-in for the supervisor that receives its commands.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import ConsumerRecord

from actors.config import WorkerConfig
from actors.control import ControlActor
from actors.kafka.connection import KafkaConnection
from actors.mail import VerifiedCommand
from actors.runtime import Actor
from messages.codec import Codec
from messages.events import Event
from ops.services.topics import create_topics
from tests.integration.pipeline import read_all

event_codec: Codec[Any] = Codec(Event)  # type: ignore[arg-type]  # a union


@dataclass(frozen=True)
class ControlLane:
    """One test's control and events topics, group and secret on the shared broker."""

    bootstrap: str
    control: str
    events: str
    group: str
    secret: str

    def worker_config(self, **overrides: Any) -> WorkerConfig:
        base = WorkerConfig(
            kafka=KafkaConnection(self.bootstrap),
            group=self.group,
            control_topic=self.control,
            events_topic=self.events,
            control_secret=self.secret,
            worker_id=f"w-{uuid.uuid4().hex[:6]}",
        )
        return replace(base, **overrides)

    def cli_args(self) -> list[str]:
        return [
            "--bootstrap-servers", self.bootstrap,
            "--control-topic", self.control,
            "--events-topic", self.events,
        ]  # fmt: skip


async def new_control_lane(bootstrap: str) -> ControlLane:
    tag = uuid.uuid4().hex[:8]
    lane = ControlLane(
        bootstrap=bootstrap,
        control=f"t{tag}.control",
        events=f"t{tag}.events",
        group=f"g{tag}",
        secret=f"secret-{tag}",
    )
    await create_topics(bootstrap, names={"control": lane.control, "events": lane.events})
    return lane


class Inbox(Actor[VerifiedCommand]):
    """Stands in for the supervisor: its mailbox holds what the control actor sent."""

    def __init__(self) -> None:
        super().__init__("inbox", 64)

    async def run(self) -> None:
        await self.stopping.wait()

    async def next(self, within_s: float = 30.0) -> VerifiedCommand:
        async with asyncio.timeout(within_s):
            return await self.mailbox.get()


class Answering(Actor[VerifiedCommand]):
    """Stands in for the supervisor: publishes `answer(command)` through the control actor."""

    def __init__(self, answer: Callable[[VerifiedCommand], list[Event]]) -> None:
        super().__init__("answering", 64)
        self.answer = answer
        self.control: ControlActor | None = None

    async def run(self) -> None:
        while (command := await self.receive()) is not None:
            assert self.control is not None
            for event in self.answer(command):
                await self.control.publish(event)


@contextlib.asynccontextmanager
async def running_control(
    config: WorkerConfig,
    commands: Actor[VerifiedCommand],
    clock: Callable[[], float] = time.time,
) -> AsyncIterator[ControlActor]:
    """A running ControlActor (and `commands` actor), once `ready`; stopped on exit."""
    control = ControlActor(config, commands, clock=clock)
    if isinstance(commands, Answering):
        commands.control = control
    async with asyncio.TaskGroup() as tg:
        supervising = tg.create_task(commands.run())
        running = tg.create_task(control.run())
        ready = tg.create_task(control.ready.wait())
        await asyncio.wait({running, ready}, timeout=60, return_when=asyncio.FIRST_COMPLETED)
        assert control.ready.is_set(), "the control actor never became ready"
        try:
            yield control
        finally:
            control.stop()
            commands.stop()
            async with asyncio.timeout(30):
                await running
                await supervising


async def read_events(
    bootstrap: str, topic: str, *, until: int, within_s: float = 30.0
) -> list[tuple[ConsumerRecord[bytes, bytes], Event]]:
    """Every event on `topic` from the beginning, once there are at least `until`."""
    records = await read_all(bootstrap, topic, until=until, within_s=within_s)
    return [(r, event_codec.decode(r.value or b"")) for r in records]


async def events_until(
    bootstrap: str, topic: str, enough: Callable[[list[Event]], bool], within_s: float = 120.0
) -> list[Event]:
    """Every event on `topic` from the beginning, once `enough(events)` holds (the deadline
    only bounds a hang: on a busy machine events come late, never fewer)."""
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False
    )
    await consumer.start()
    events: list[Event] = []
    try:
        deadline = time.monotonic() + within_s
        while not enough(events):
            assert time.monotonic() < deadline, f"not enough events within {within_s} s: {events}"
            fetched = await consumer.getmany(timeout_ms=500)
            events += [event_codec.decode(r.value or b"") for b in fetched.values() for r in b]
    finally:
        await consumer.stop()
    return events
