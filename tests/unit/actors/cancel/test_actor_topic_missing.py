"""CancelActor with a cancel topic that does not exist yet: one warning, a metadata request
every `topic_recheck_s` (never the consumer's own ten a second), True once it is there, False
when stopped first."""

from __future__ import annotations

import asyncio

from structlog.testing import capture_logs

from actors.cancel.actor import CancelActor
from actors.config import WorkerConfig


class _Consumer:
    """Answers `topics()` with no cancel topic `missing` times, then with it."""

    def __init__(self, topic: str, missing: int) -> None:
        self.topic, self.missing, self.asked = topic, missing, 0
        self.was_asked: asyncio.Event | None = None  # set on each question, where given

    async def topics(self) -> set[str]:
        self.asked += 1
        if self.was_asked is not None:
            self.was_asked.set()
        return {"other"} if self.asked <= self.missing else {"other", self.topic}


def _actor() -> CancelActor:
    config = WorkerConfig(cancel_topic="lane.cancel")
    actor = CancelActor(config, cancels=None)  # type: ignore[arg-type]  # never sends here
    actor.topic_recheck_s = 0.0
    return actor


def test_a_missing_topic_is_reported_once_and_found_when_it_appears() -> None:
    actor = _actor()
    consumer = _Consumer(actor.topic, missing=3)
    with capture_logs() as logs:
        found = asyncio.run(actor._topic_found(consumer))  # type: ignore[arg-type]
    assert found and consumer.asked == 4
    events = [e["event"] for e in logs]
    assert events == ["cancel_topic_missing", "cancel_topic_found"]


def test_a_topic_that_exists_is_found_at_once_and_quietly() -> None:
    actor = _actor()
    consumer = _Consumer(actor.topic, missing=0)
    with capture_logs() as logs:
        assert asyncio.run(actor._topic_found(consumer))  # type: ignore[arg-type]
    assert consumer.asked == 1 and logs == []


def test_stopping_ends_the_wait_for_a_topic_that_never_comes() -> None:
    actor = _actor()
    actor.topic_recheck_s = 3600.0
    consumer = _Consumer(actor.topic, missing=10**9)

    async def main() -> bool:
        consumer.was_asked = asyncio.Event()
        waiting = asyncio.create_task(actor._topic_found(consumer))  # type: ignore[arg-type]
        await consumer.was_asked.wait()
        actor.stopping.set()
        return await waiting

    assert asyncio.run(main()) is False
    assert consumer.asked == 1
