"""What one `bench swap` run records: when each request went out, the swap's events, and the
results as they arrive; apart from `ops/bench/swap.py` so its report can name them."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, field

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition

from actors.kafka.connection import KafkaConnection
from messages.codec import Codec
from messages.events import Event
from messages.result import GenerateResult

_results = Codec(GenerateResult)


@dataclass(frozen=True)
class Stamp:
    """When something happened here: monotonic seconds for durations, unix for windows."""

    mono: float
    unix: float

    @staticmethod
    def now() -> Stamp:
        return Stamp(time.monotonic(), time.time())


@dataclass
class SwapRun:
    """What the load and the swap left behind, for `summarize`."""

    sent: dict[str, Stamp] = field(default_factory=dict)  # request id → handed to the producer
    late_ms: list[float] = field(default_factory=list)  # each send behind its schedule
    load_span: tuple[float, float] = (0.0, 0.0)  # unix: first and last send
    command_at: float | None = None  # unix, just before `send_command`
    events: list[Event] = field(default_factory=list)  # those answering the swap command


class ResultLog:
    """Reads the results topic from its end as it was on entry; stamps each result on arrival."""

    def __init__(self, kafka: KafkaConnection, topic: str, partitions: Collection[int]) -> None:
        self.tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        self.consumer = AIOKafkaConsumer(**kafka.client_kwargs(), enable_auto_commit=False)
        self.first: dict[str, tuple[Stamp, GenerateResult]] = {}  # id → its first result
        self.duplicates: Counter[str] = Counter()  # id → results after the first
        self._fetched = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> ResultLog:
        await self.consumer.start()
        try:
            self.consumer.assign(self.tps)
            await self.consumer.seek_to_end(*self.tps)
            for tp in self.tps:  # resolve positions now, not lazily after results arrive
                await self.consumer.position(tp)
        except BaseException:
            await self.consumer.stop()
            raise
        self._task = asyncio.create_task(self._collect())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.consumer.stop()

    async def _collect(self) -> None:
        while True:
            fetched = await self.consumer.getmany(timeout_ms=100, max_records=10_000)
            stamp = Stamp.now()
            for records in fetched.values():
                for record in records:
                    result = _results.decode(record.value or b"")
                    if result.id in self.first:
                        self.duplicates[result.id] += 1
                    else:
                        self.first[result.id] = (stamp, result)
            if fetched:
                self._fetched.set()

    async def missing(self, ids: Collection[str], within_s: float) -> set[str]:
        """The ids still unanswered once every one is in, or after `within_s` seconds."""
        left = set(ids) - self.first.keys()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within_s):
                while left:
                    self._fetched.clear()
                    await self._fetched.wait()
                    left -= self.first.keys()
        return left
