"""A consumer without a broker, for the readers' unit tests: it joins its group at the first
poll (calling the rebalance listener), hands out the records fed to it, and keeps commits."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from aiokafka.structs import ConsumerRecord, OffsetAndMetadata, TopicPartition


def record(
    tp: TopicPartition, offset: int, value: bytes | None, headers: Sequence[Any] = ()
) -> ConsumerRecord[bytes, bytes]:
    return ConsumerRecord(
        topic=tp.topic, partition=tp.partition, offset=offset, timestamp=0, timestamp_type=0,
        key=None, value=value, checksum=None, serialized_key_size=-1,
        serialized_value_size=len(value or b""), headers=list(headers),
    )  # fmt: skip


class FakeConsumer:
    def __init__(
        self, partitions: Iterable[TopicPartition], records: Iterable[Any] = (), topics=()
    ) -> None:
        self.partitions = set(partitions)
        self.queue: list[Any] = list(records)
        self.commits: list[dict[TopicPartition, tuple[int, str]]] = []
        self.committed: dict[TopicPartition, tuple[int, str]] = {}
        self.listener: Any = None
        self.joined = False
        self.stopped = False
        self.paused_partitions: set[TopicPartition] = set()
        self.positions: dict[TopicPartition, int] = {}
        self.failures: list[Exception] = []  # raised by the next polls, in order
        self.topic_names = set(topics)
        self._fed = asyncio.Event()
        self.committed_event = asyncio.Event()  # set by every commit
        self.highwaters: dict[TopicPartition, int] = {}
        self._coordinator = self  # where the committer reads commits with their metadata

    def feed(self, *records: Any) -> None:
        self.queue.extend(records)
        self._fed.set()

    # -- the Consumer protocol -----------------------------------------------------------

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        self.stopped = True

    def subscribe(self, topics: Sequence[str], *, listener: Any) -> None:
        self.listener = listener

    def assignment(self) -> set[TopicPartition]:
        return set(self.partitions) if self.joined or self.listener is None else set()

    async def getmany(
        self, *partitions: TopicPartition, timeout_ms: int = 0, max_records: int | None = None
    ) -> dict[TopicPartition, list[Any]]:
        if not self.joined and self.listener is not None:
            self.joined = True
            await self.listener.on_partitions_assigned(set(self.partitions))
        if self.failures:
            raise self.failures.pop(0)
        ready = self._ready(max_records)
        if not ready:  # a poll that finds nothing waits for its timeout, or for records
            self._fed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._fed.wait(), timeout_ms / 1000)
            ready = self._ready(max_records)
        out: dict[TopicPartition, list[Any]] = {}
        for r in ready:
            self.queue.remove(r)
            out.setdefault(TopicPartition(r.topic, r.partition), []).append(r)
        return out

    def _ready(self, max_records: int | None) -> list[Any]:
        """The records a poll may hand out: not of a paused partition, at most `max_records`."""
        ready = [r for r in self.queue
                 if TopicPartition(r.topic, r.partition) not in self.paused_partitions]  # fmt: skip
        return ready if max_records is None else ready[:max_records]

    async def commit(self, offsets: Mapping[TopicPartition, tuple[int, str]]) -> None:
        self.commits.append(dict(offsets))
        self.committed.update(offsets)
        self.committed_event.set()

    async def fetch_committed_offsets(
        self, partitions: list[TopicPartition]
    ) -> dict[TopicPartition, OffsetAndMetadata]:
        return {tp: OffsetAndMetadata(*self.committed[tp]) for tp in partitions
                if tp in self.committed}  # fmt: skip

    async def topics(self) -> set[str]:
        return set(self.topic_names)

    async def position(self, tp: TopicPartition) -> int:
        return self.positions.get(tp, 0)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.positions[tp] = offset

    async def seek_to_committed(self, *partitions: TopicPartition) -> None:
        for tp in partitions:
            self.positions[tp] = self.committed.get(tp, (0, ""))[0]

    async def seek_to_end(self, *partitions: TopicPartition) -> None:
        pass

    async def offsets_for_times(self, timestamps: Mapping[TopicPartition, int]) -> Any:
        return {tp: None for tp in timestamps}

    async def end_offsets(self, partitions: list[TopicPartition]) -> Any:
        return {tp: 0 for tp in partitions}

    def highwater(self, tp: TopicPartition) -> int | None:
        return self.highwaters.get(tp)

    def pause(self, *partitions: TopicPartition) -> None:
        self.paused_partitions.update(partitions)

    def resume(self, *partitions: TopicPartition) -> None:
        self.paused_partitions.difference_update(partitions)

    def paused(self) -> set[TopicPartition]:
        return set(self.paused_partitions)
