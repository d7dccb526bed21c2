"""What the fleet serves, for `GET /v1/models`: read from the workers' events topic.

Each worker announces its model when it starts (`worker_started`) and when it swaps
(`model_swapped`), and answers status requests with it (`status_reply`); `worker_stopped`
takes it off. The gateway reads the events topic from its beginning (it is small: one record
per such event) and keeps each worker's current model; the models listed are those at least
one live worker serves. A worker that died without a `worker_stopped` stays listed until the
topic's retention forgets it.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

import msgspec
import structlog
from aiokafka import AIOKafkaConsumer

from actors.kafka import record_reader
from actors.kafka.connection import KafkaConnection
from messages import headers as h
from messages.codec import Codec, normalize_content_type
from messages.errors import MessageError
from messages.events import Event, ModelSwapped, StatusReply, WorkerStarted, WorkerStopped

log = structlog.get_logger("tokenmill.gateway")
_event_codec: Codec[Event] = Codec(Event)  # type: ignore[arg-type]  # a union, not a class


@dataclass(frozen=True)
class ServedModel:
    name: str
    since: int  # unix seconds: when a worker first announced it (OpenAI's `created`)


class Fleet:
    """Each worker's current model, from the events it publishes (`apply`)."""

    def __init__(self) -> None:
        self._by_worker: dict[str, str] = {}
        self._since: dict[str, int] = {}

    def apply(self, event: Event) -> None:
        match event:
            case WorkerStarted(model=model) | StatusReply(model=model):
                self._serve(event.worker, model.name, event.at)
            case ModelSwapped(to_model=model):
                self._serve(event.worker, model.name, event.at)
            case WorkerStopped():
                self._by_worker.pop(event.worker, None)

    def _serve(self, worker: str, name: str, at: float) -> None:
        self._by_worker[worker] = name
        self._since.setdefault(name, int(at))

    def models(self) -> list[ServedModel]:
        return [ServedModel(n, self._since[n]) for n in sorted(set(self._by_worker.values()))]


class FleetWatch:
    """Reads the events topic into a `Fleet` in a task of its own, from the beginning."""

    def __init__(self, kafka: KafkaConnection, topic: str) -> None:
        self.kafka = kafka
        self.topic = topic
        self.fleet = Fleet()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._watch(), name="gateway-fleet")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _watch(self) -> None:
        record_reader.install()
        # No group: every partition, from the beginning (no offsets are ever committed);
        # a topic that does not exist yet is picked up when it appears.
        consumer = AIOKafkaConsumer(
            self.topic,
            **self.kafka.client_kwargs(),
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        )
        await consumer.start()
        try:
            while True:
                fetched = await consumer.getmany(timeout_ms=1000)
                for records in fetched.values():
                    for record in records:
                        if (event := _decode(record.value, record.headers)) is not None:
                            self.fleet.apply(event)
        finally:
            await consumer.stop()


def _decode(value: bytes | None, headers: h.Headers) -> Event | None:
    try:
        ctype = normalize_content_type(h.header(headers, h.CONTENT_TYPE))
        return _event_codec.decode(value or b"", ctype)
    except (msgspec.DecodeError, MessageError, RecursionError):
        return None
