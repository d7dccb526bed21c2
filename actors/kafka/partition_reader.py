"""PartitionReader: one consumer in one group, its assignment, and a fetch that never crashes on
a record. Shared by the ingest, cancel and control actors.

    reader = PartitionReader(make_consumer, name="cancel", settings=config, stopping=stopping)
    if await reader.open(topic) is None:         # started once the broker answers
        return                                   # stopped first
    async for record in reader.records():        # until `stopping`
        ...
    await reader.close()

The consumer comes from an injected factory (`Consumer` is the part of `AIOKafkaConsumer` the
readers use), so an actor can be driven by a fake one in tests. `record_reader.install()` runs
before the first consumer is made: a record aiokafka cannot parse reaches the actor marked.

Assignment: every rebalance bumps `generation` (a fetch made under an older one is not the
reader's to track past it) and calls the `Partitions` hooks, if any; `ready` is set once the
newest assignment has every position resolved (`keep_ready`: a record produced after that is
seen), and cleared at every revocation.

Fetching: `fetch()` raises `KafkaError` (the broker's side: the supervisor restarts the actor
with backoff); any other failure is a record aiokafka could not hand out (record_reader's gap):
logged as `<event>`, then, after a pause that grows with each failure, fetched again, from
`resume_at(tp)` (or the last commit) when the actor tracks positions.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, TypeAlias

import structlog
from aiokafka import ConsumerRebalanceListener
from aiokafka.errors import IllegalStateError, KafkaError
from aiokafka.structs import ConsumerRecord, TopicPartition

from actors.kafka import record_reader
from actors.kafka.broker_wait import Settings, started

log = structlog.get_logger("tokenmill.kafka")

POLL_MS = 100

Record: TypeAlias = "ConsumerRecord[bytes, bytes]"
Fetched: TypeAlias = "dict[TopicPartition, list[Record]]"


class Consumer(Protocol):
    """What the readers ask of a consumer (`AIOKafkaConsumer` has it all)."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def subscribe(self, topics: Sequence[str], *, listener: Any) -> None: ...

    def assignment(self) -> set[TopicPartition]: ...

    async def getmany(self, *partitions: TopicPartition, timeout_ms: int = ...,
                      max_records: int | None = ...) -> Fetched: ...  # fmt: skip

    async def commit(self, offsets: Any = ...) -> None: ...

    async def topics(self) -> set[str]: ...

    async def position(self, tp: TopicPartition) -> int: ...

    def seek(self, tp: TopicPartition, offset: int) -> None: ...

    async def seek_to_committed(self, *partitions: TopicPartition) -> Any: ...

    async def seek_to_end(self, *partitions: TopicPartition) -> Any: ...

    async def offsets_for_times(self, timestamps: Mapping[TopicPartition, int]) -> Any: ...

    async def end_offsets(self, partitions: list[TopicPartition]) -> Any: ...

    def highwater(self, tp: TopicPartition) -> int | None: ...

    def pause(self, *partitions: TopicPartition) -> None: ...

    def resume(self, *partitions: TopicPartition) -> None: ...

    def paused(self) -> set[TopicPartition]: ...


class Partitions(Protocol):
    """An actor's part in a rebalance: called with the consumer, after `generation` moved."""

    async def assigned(self, consumer: Consumer, assigned: set[TopicPartition]) -> None: ...

    async def revoked(self, consumer: Consumer, revoked: set[TopicPartition]) -> None: ...


class PartitionReader:
    def __init__(
        self,
        make: Callable[[], Consumer],
        *,
        name: str,
        settings: Settings,
        stopping: asyncio.Event,
        partitions: Partitions | None = None,
        resume_at: Callable[[TopicPartition], int | None] | None = None,
        failed_event: str = "fetch_failed",
        ready: asyncio.Event | None = None,
    ) -> None:
        """`make`: a new, unstarted consumer (called again for each try while the broker is
        away); `partitions`: the actor's rebalance hooks; `resume_at`: where to fetch a
        partition from again after a failed fetch (None: the reader keeps no positions, and
        the consumer goes on from where it is); `ready`: the actor's own event, when it has
        one that outlives this reader."""
        self._make = make
        self.name = name
        self.settings = settings
        self.stopping = stopping
        self.partitions = partitions
        self.resume_at = resume_at
        self.failed_event = failed_event
        self.consumer: Consumer | None = None
        self.generation = 0  # bumped by every rebalance
        self.joined = False  # the consumer joined its group (had an assignment, maybe empty)
        self.ready = ready if ready is not None else asyncio.Event()
        self.fetch_failures = 0  # in all
        self._in_a_row = 0  # since the last fetch that did not fail: the pause grows with it
        self._assigned = asyncio.Event()
        self._topics: list[str] = []

    # -- life --------------------------------------------------------------------------------

    async def open(self, topic: str | Sequence[str] | None = None) -> Consumer | None:
        """Start a consumer once the broker answers, subscribed to `topic` (one, or several)
        if given (else see `subscribe`); None when `stopping` came first."""
        record_reader.install()  # no record in a fetch can make getmany() raise
        self._topics = [topic] if isinstance(topic, str) else list(topic or [])
        consumer = await started(
            self._new, name=self.name, stopping=self.stopping, settings=self.settings
        )
        self.consumer = consumer
        return consumer

    def _new(self) -> Consumer:
        consumer = self._make()
        if self._topics:
            consumer.subscribe(self._topics, listener=_Listener(self, consumer))
        return consumer

    def subscribe(self, topic: str) -> None:
        consumer = self._started()
        consumer.subscribe([topic], listener=_Listener(self, consumer))

    async def close(self) -> None:
        self.ready.clear()
        if self.consumer is not None:
            await self.consumer.stop()

    async def topics(self) -> set[str]:
        """The topics the broker has (a metadata request)."""
        return set(await self._started().topics())

    def _started(self) -> Consumer:
        if self.consumer is None:
            raise KafkaError(f"the {self.name} consumer is not started")
        return self.consumer

    # -- assignment --------------------------------------------------------------------------

    def assignment(self) -> set[TopicPartition]:
        return self.consumer.assignment() if self.consumer is not None else set()

    async def on_assigned(self, consumer: Consumer, assigned: set[TopicPartition]) -> None:
        self.generation += 1
        self.joined = True
        if self.partitions is not None:
            await self.partitions.assigned(consumer, assigned)
        self._assigned.set()

    async def on_revoked(self, consumer: Consumer, revoked: set[TopicPartition]) -> None:
        self.generation += 1
        self.ready.clear()
        if self.partitions is not None:
            await self.partitions.revoked(consumer, revoked)

    async def keep_ready(self, on_ready: Callable[[int], None]) -> None:
        """Forever: after each assignment, resolve every position, then set `ready` and call
        `on_ready(partitions)`, unless another assignment came meanwhile (its own round sets
        it)."""
        consumer = self._started()
        while True:
            await self._assigned.wait()
            self._assigned.clear()
            try:
                for tp in consumer.assignment():
                    await consumer.position(tp)
            except IllegalStateError:  # revoked meanwhile: the next assignment sets it
                continue
            if not self._assigned.is_set():
                self.ready.set()
                on_ready(len(consumer.assignment()))

    def pause_all(self) -> None:
        if (consumer := self.consumer) is not None:
            consumer.pause(*consumer.assignment())

    def resume_all(self) -> None:
        if (consumer := self.consumer) is not None:
            consumer.resume(*consumer.assignment())

    @property
    def paused(self) -> int:
        consumer = self.consumer
        return len(consumer.paused()) if consumer is not None and self.joined else 0

    def lag(self, fetched_to: Mapping[TopicPartition, int]) -> dict[int, int]:
        """Records not yet fetched, per assigned partition (from the high watermark of the last
        fetch; partitions not fetched from yet are left out)."""
        consumer = self.consumer
        if consumer is None or not self.joined:
            return {}
        out = {}
        for tp in consumer.assignment():
            high = consumer.highwater(tp)
            if high is not None and tp in fetched_to:
                out[tp.partition] = max(high - fetched_to[tp], 0)
        return out

    # -- fetching ----------------------------------------------------------------------------

    async def fetch(self, max_records: int | None = None) -> Fetched | None:
        """One poll: the records fetched (maybe none); None when the fetch failed on its
        records (logged, and waited out: the caller polls again)."""
        consumer = self._started()
        try:
            if max_records is None:
                fetched = await consumer.getmany(timeout_ms=POLL_MS)
            else:
                fetched = await consumer.getmany(timeout_ms=POLL_MS, max_records=max_records)
        except KafkaError:
            raise  # the broker's side: the supervisor's restart and backoff
        except Exception as exc:  # a record aiokafka cannot hand out (record_reader's gap)
            await self._failed(consumer, exc)
            return None
        self._in_a_row = 0
        return fetched

    async def _failed(self, consumer: Consumer, exc: Exception) -> None:
        """Fetch again from the first record not yet handled on each partition, after a pause
        (records handed out before the failure in this fetch were lost with it)."""
        self.fetch_failures += 1
        self._in_a_row += 1
        log.error(self.failed_event, error=repr(exc)[:500], failures=self._in_a_row)
        if self.resume_at is not None:
            for tp in consumer.assignment():
                if (offset := self.resume_at(tp)) is not None:
                    consumer.seek(tp, offset)
                else:
                    await consumer.seek_to_committed(tp)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), min(0.1 * 2**self._in_a_row, 5.0))

    async def records(self) -> AsyncIterator[Record]:
        """Every record fetched, in each partition's order, until `stopping`."""
        while not self.stopping.is_set():
            for records in (await self.fetch() or {}).values():
                for record in records:
                    yield record


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, reader: PartitionReader, consumer: Consumer) -> None:
        self.reader = reader
        self.consumer = consumer

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self.reader.on_revoked(self.consumer, revoked)

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        await self.reader.on_assigned(self.consumer, assigned)


def names(tps: Iterable[TopicPartition]) -> list[str]:
    """`topic/partition` of each, sorted: for logs."""
    return sorted(f"{tp.topic}/{tp.partition}" for tp in tps)
