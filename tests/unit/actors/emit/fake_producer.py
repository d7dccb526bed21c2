"""Producers' cluster metadata as tests control it: one that knows every topic (`EveryTopic`),
and a producer (`MetadataProducer`) whose broker's topics, the topics it knows, the topics
deleted while it knew them, and whether the broker answers metadata requests at all, are set
by the test."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from aiokafka.producer.message_accumulator import MessageAccumulator
from aiokafka.structs import TopicPartition


class EveryTopic:
    """Cluster metadata that knows every topic (one partition each)."""

    def partitions_for_topic(self, topic: str) -> set[int]:
        return {0}


class MetadataProducer:
    """Acknowledges every record at once; `send` to a topic it does not know is a test error
    (aiokafka's would wait for the topic's metadata, which the emitter must not do in line)."""

    def __init__(
        self,
        known: set[str],
        *,
        broker: set[str] | None = None,
        deleted: frozenset[str] = frozenset(),
    ) -> None:
        self.known = set(known)  # topics whose metadata the producer has
        self.broker = broker  # the broker's topics; None: it does not answer
        # Known to the producer but deleted: their records stay queued in aiokafka's own
        # accumulator, never acknowledged, as a real producer's would.
        self.deleted = set(deleted)
        self.sent: list[tuple[str, bytes, bytes | None]] = []
        self.metadata_updates = 0
        self.client = SimpleNamespace(
            cluster=SimpleNamespace(partitions_for_topic=self._partitions),
            fetch_all_metadata=self._fetch_all_metadata,
            force_metadata_update=self._force_metadata_update,
        )
        self._message_accumulator: MessageAccumulator | None = None  # made on first use
        self._txn_manager = None

    def appear(self, topic: str) -> None:
        """`topic` is made (again) now: the broker has it, and the producer's metadata gets it."""
        self.known.add(topic)
        self.deleted.discard(topic)
        if self.broker is not None:
            self.broker.add(topic)

    def _partitions(self, topic: str) -> set[int] | None:
        return {0} if topic in self.known else None

    async def partitions_for(self, topic: str) -> set[int]:
        if self.broker is not None and topic in self.broker:
            self.known.add(topic)  # learnt from the broker
        assert topic in self.known, "asked only once the broker has it"
        return {0}

    async def _fetch_all_metadata(self) -> Any:
        if self.broker is None:
            await asyncio.Event().wait()  # never answered
        broker = set(self.broker or ())
        return SimpleNamespace(topics=lambda: broker, unauthorized_topics=set())

    async def _force_metadata_update(self) -> bool:
        self.metadata_updates += 1
        if self.broker is not None:
            self.known &= self.broker
        return True

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def send(self, topic: str, *, value: bytes, key: Any, headers: Any) -> Any:
        assert topic in self.known, f"send() would wait for {topic!r}'s metadata in line"
        if topic in self.deleted:
            if self._message_accumulator is None:
                self._message_accumulator = MessageAccumulator(None, 16384, 0, 3600.0)
            tp = TopicPartition(topic, 0)
            return await self._message_accumulator.add_message(tp, key, value, timeout=1.0)
        self.sent.append((topic, value, key))
        ack: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        ack.set_result(None)
        return ack
