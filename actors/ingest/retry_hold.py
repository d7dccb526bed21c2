"""Retries held until they are due: a retry topic's partition waits, paused, for its next
record's not-before time (`tokenmill-not-before`), while every other partition goes on.

    hold = RetryHold(config.retry_topics)
    due = hold.split(consumer, fetched)   # what may run now; a partition whose next record
                                          # is not due is sought back to it and paused
    await hold.resume_loop(resume)        # calls resume(partitions) as each comes due

A retry topic holds one backoff (`<requests topic>.retry.<N>`: the retries after attempt N),
so its records come due in the order they were written: the first one not due stops its
partition, and nothing behind it is due earlier (Spring Kafka's retry topics work the same
way). Nothing fetched past it is run or tracked: it is fetched again once resumed. A record
of a requests topic, or one without the header, is due at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable

import structlog
from aiokafka.structs import TopicPartition

from actors.kafka.partition_reader import Consumer, Fetched
from messages.attempts import not_before_ms

log = structlog.get_logger("tokenmill.ingest")


class RetryHold:
    def __init__(self, retry_topics: Iterable[str], clock: Callable[[], float] = time.time) -> None:
        """`clock`: epoch seconds (the not-before times are a producer's wall clock)."""
        self.topics = frozenset(retry_topics)
        self.clock = clock
        self.held: dict[TopicPartition, int] = {}  # paused until (epoch ms)
        self._changed = asyncio.Event()

    def split(self, consumer: Consumer, fetched: Fetched) -> Fetched:
        """`fetched` less the records not due yet: each retry partition's up to the first one
        not due, which it is sought back to, paused until that one is due."""
        if not self.topics:
            return fetched
        now_ms = int(self.clock() * 1000)
        out: Fetched = {}
        for tp, records in fetched.items():
            if tp.topic not in self.topics:
                out[tp] = records
                continue
            due = []
            for record in records:
                at = not_before_ms(record.headers)
                if at is not None and at > now_ms:
                    consumer.seek(tp, record.offset)
                    consumer.pause(tp)
                    self.held[tp] = at
                    self._changed.set()
                    log.debug("retry_held", topic=tp.topic, partition=tp.partition,
                              offset=record.offset, due_in_ms=at - now_ms)  # fmt: skip
                    break
                due.append(record)
            if due:
                out[tp] = due
        return out

    def still_held(self) -> list[TopicPartition]:
        """The partitions paused for a retry not yet due (kept paused by a general resume)."""
        now_ms = int(self.clock() * 1000)
        return [tp for tp, at in self.held.items() if at > now_ms]

    def forget(self, partitions: Iterable[TopicPartition]) -> None:
        """Revoked or assigned afresh: a new assignment starts unpaused, at the last commit."""
        for tp in partitions:
            self.held.pop(tp, None)

    async def resume_loop(self, resume: Callable[[list[TopicPartition]], None]) -> None:
        """Forever: `resume(partitions)` for each held partition as it comes due."""
        while True:
            self._changed.clear()
            timeout = None
            if self.held:
                timeout = max(0.0, min(self.held.values()) / 1000 - self.clock())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout)
            now_ms = int(self.clock() * 1000)
            due = [tp for tp, at in self.held.items() if at <= now_ms]
            for tp in due:
                del self.held[tp]
            if due:
                resume(due)
