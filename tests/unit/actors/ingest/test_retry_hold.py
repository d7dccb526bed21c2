"""Retries wait for their backoff on a paused partition; everything else runs at once."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

from aiokafka.structs import TopicPartition

from actors.ingest.refusals import attempts_after_deaths
from actors.ingest.retry_hold import RetryHold
from messages import headers as h
from messages.attempts import Attempts, failed_attempt

RETRY = TopicPartition("lane.requests.retry.1", 0)
REQUESTS = TopicPartition("lane.requests", 0)


class FakeConsumer:
    def __init__(self) -> None:
        self.sought: dict[TopicPartition, int] = {}
        self.paused: set[TopicPartition] = set()

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.sought[tp] = offset

    def pause(self, *tps: TopicPartition) -> None:
        self.paused |= set(tps)


def record(tp: TopicPartition, offset: int, not_before_ms: int | None) -> Any:
    headers = [] if not_before_ms is None else [(h.NOT_BEFORE, str(not_before_ms).encode())]
    return SimpleNamespace(topic=tp.topic, partition=tp.partition, offset=offset, headers=headers)


def test_a_retry_partition_stops_at_its_first_record_not_due() -> None:
    now = [100.0]
    hold = RetryHold(["lane.requests.retry.1"], clock=lambda: now[0])
    consumer = FakeConsumer()
    fetched = {
        RETRY: [record(RETRY, 4, 99_000), record(RETRY, 5, 101_000), record(RETRY, 6, 99_500)],
        REQUESTS: [record(REQUESTS, 9, 999_999_999)],  # a requests topic: never held
    }
    due = hold.split(cast(Any, consumer), fetched)
    assert [r.offset for r in due[RETRY]] == [4]
    assert [r.offset for r in due[REQUESTS]] == [9]
    assert consumer.sought == {RETRY: 5} and consumer.paused == {RETRY}
    assert hold.held == {RETRY: 101_000} and hold.still_held() == [RETRY]
    now[0] = 101.0
    assert hold.still_held() == []


def test_a_partition_with_nothing_due_is_left_out() -> None:
    hold = RetryHold(["lane.requests.retry.1"], clock=lambda: 0.0)
    consumer = FakeConsumer()
    assert hold.split(cast(Any, consumer), {RETRY: [record(RETRY, 0, 5_000)]}) == {}
    hold.forget([RETRY])
    assert hold.held == {}


async def test_a_held_partition_is_resumed_once_due() -> None:
    hold = RetryHold(["lane.requests.retry.1"])
    consumer = FakeConsumer()
    loop = asyncio.get_running_loop()
    resumed: asyncio.Future[list[TopicPartition]] = loop.create_future()
    task = asyncio.create_task(hold.resume_loop(resumed.set_result))
    soon = int((hold.clock() + 0.05) * 1000)
    hold.split(cast(Any, consumer), {RETRY: [record(RETRY, 3, soon)]})
    assert await asyncio.wait_for(resumed, 5) == [RETRY]
    assert hold.held == {}
    task.cancel()


def test_a_quarantined_records_deaths_are_attempts_after_its_own() -> None:
    first = failed_attempt(1, worker="w", code="engine_error", message="e")
    after = attempts_after_deaths(Attempts(2, (first,)), deaths=3)
    assert after.number == 4, "attempts 2, 3, 4 each killed a worker"
    assert [(e.attempt, e.code) for e in after.history] == [
        (1, "engine_error"), (2, "worker_died"), (3, "worker_died"), (4, "worker_died")
    ]  # fmt: skip
