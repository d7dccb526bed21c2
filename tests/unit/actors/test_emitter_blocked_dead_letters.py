"""Dead letters are never dropped: one the DLQ refuses even trimmed is sent again until the DLQ
takes it, and its outcome is reported delivered (its offset committable) only then; the ingest
is told at once that it is blocked (`OutcomeBlocked`, so a drain does not wait for it). Others
go on meanwhile; a stop gives it up, undelivered. A fake producer stands in for the broker."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.errors import TopicAuthorizationFailedError
from structlog.testing import capture_logs

import actors.emit.dead_letters as dead_letters_module
from actors.config import WorkerConfig
from actors.emitter import EmitterActor
from actors.kafka.errors import KafkaUnusable
from actors.kafka.preflight import TopicCheck
from actors.mail import Delivered, Outcome, OutcomeBlocked, RecordRef
from actors.results import rejected_at_door
from actors.runtime import Mailbox
from actors.telemetry.trace_context import TraceContext
from messages.codec import JSON
from messages.error_codes import ErrorCode
from tests.unit.actors.emit.fake_producer import EveryTopic

DLQ = "lane.dlq"


class FakeProducer:
    """Acknowledges every record at once, except the DLQ's while `dlq_refuses`."""

    def __init__(self) -> None:
        self.dlq_refuses = True
        self.sent: list[tuple[str, bytes]] = []
        self.client = SimpleNamespace(cluster=EveryTopic())  # cluster metadata, as aiokafka has it

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def send(self, topic: str, *, value: bytes, key: Any, headers: Any) -> Any:
        self.sent.append((topic, value))
        ack: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        if topic == DLQ and self.dlq_refuses:
            ack.set_exception(TopicAuthorizationFailedError())
        else:
            ack.set_result(None)
        return ack


def dead_letter_outcome(partition: int, offset: int) -> Outcome:
    return rejected_at_door(
        RecordRef("lane.requests", partition, offset, 0), ErrorCode.INVALID_JSON, "not JSON",
        request_id="", reply_topic="lane.results", content_type=JSON, worker="w1",
        value=b"{x" * 100, headers=[], trace=TraceContext(),
    )  # fmt: skip


Notice = Delivered | OutcomeBlocked


def emitter(**overrides: Any) -> tuple[EmitterActor, FakeProducer, Mailbox[Notice]]:
    config = WorkerConfig(results_topic="lane.results", dlq_topic=DLQ, **overrides)
    delivered: Mailbox[Notice] = Mailbox(64)
    actor = EmitterActor(config, delivered=delivered)
    producer = FakeProducer()
    actor._new_producer = lambda: producer  # type: ignore[method-assign]
    actor._dlq_checked = True  # the start-up check has its own tests
    actor.blocked_retry_s = 0.02
    return actor, producer, delivered


def waiting(mailbox: Mailbox[Notice]) -> list[tuple[str, int, int]]:
    """What the ingest was told so far, taken: (kind, partition, offset) each."""
    out = []
    while not mailbox.empty():
        notice = mailbox.get_nowait()
        out.append((type(notice).__name__, notice.record.partition, notice.record.offset))
    return out


async def until(condition: Any) -> None:
    """Poll `condition` (the emitter offers no event for these)."""
    async with asyncio.timeout(10):
        while not condition():  # noqa: ASYNC110
            await asyncio.sleep(0.005)


async def test_a_blocked_dead_letter_is_delivered_only_once_the_dlq_takes_it() -> None:
    actor, producer, delivered = emitter()
    with capture_logs() as logs:
        task = asyncio.create_task(actor.run())
        await actor.send(dead_letter_outcome(0, 7))
        await until(lambda: sum(e["event"] == "dead_letter_blocked" for e in logs) >= 3)
        # Told blocked once, not delivered: its offset must not be committed.
        assert waiting(delivered) == [("OutcomeBlocked", 0, 7)]
        assert actor.blocked and next(iter(actor.blocked.values())).offset == 7
        producer.dlq_refuses = False
        done = await asyncio.wait_for(delivered.get(), 10)
        assert isinstance(done, Delivered)
        actor.stop()
        await task
    assert (done.record.partition, done.record.offset) == (0, 7)
    assert actor.blocked == {} and actor.dead_letters_sent == 1
    blocked = [e for e in logs if e["event"] == "dead_letter_blocked"]
    assert (blocked[0]["topic"], blocked[0]["partition"], blocked[0]["offset"]) == (
        "lane.requests", 0, 7,
    )  # fmt: skip
    assert blocked[0]["dlq"] == DLQ
    assert "dead_letter_unblocked" in [e["event"] for e in logs]
    letters = [value for topic, value in producer.sent if topic == DLQ]
    assert letters[0] != b"" and set(letters[1:]) == {b""}, "the original, then trimmed ones"


async def test_other_outcomes_are_delivered_while_one_is_blocked() -> None:
    actor, _, delivered = emitter()
    task = asyncio.create_task(actor.run())
    await actor.send(dead_letter_outcome(0, 7))
    fine = dead_letter_outcome(1, 3)
    fine.dead_letter = None  # a plain error result: nothing for the DLQ
    await actor.send(fine)
    told = [await asyncio.wait_for(delivered.get(), 10) for _ in range(2)]
    assert {(type(n).__name__, n.record.partition, n.record.offset) for n in told} == {
        ("Delivered", 1, 3), ("OutcomeBlocked", 0, 7),
    }  # fmt: skip
    assert delivered.empty() and len(actor.blocked) == 1
    actor.stop()
    await task


async def test_stop_gives_a_blocked_dead_letter_up_undelivered() -> None:
    actor, _, delivered = emitter()
    with capture_logs() as logs:
        task = asyncio.create_task(actor.run())
        await actor.send(dead_letter_outcome(0, 7))
        await until(lambda: actor.blocked)
        actor.stop()
        await asyncio.wait_for(task, 10)
    assert waiting(delivered) == [("OutcomeBlocked", 0, 7)], "never delivered"
    assert actor.blocked == {}
    assert actor.dead_letters_abandoned == 1
    (abandoned,) = [e for e in logs if e["event"] == "dead_letter_abandoned"]
    assert (abandoned["partition"], abandoned["offset"]) == (0, 7)


async def test_a_blocked_dead_letter_keeps_its_place_in_the_window() -> None:
    """A DLQ that refuses everything stops the emitter once the window is full: the memory
    blocked letters hold is bounded, and the ingest's backpressure takes over."""
    actor, producer, delivered = emitter(emit_max_in_flight=1)
    task = asyncio.create_task(actor.run())
    await actor.send(dead_letter_outcome(0, 7))
    await until(lambda: actor.blocked)
    fine = dead_letter_outcome(1, 3)
    fine.dead_letter = None
    await actor.send(fine)
    await asyncio.sleep(0.1)
    assert waiting(delivered) == [("OutcomeBlocked", 0, 7)], "the next one waits for the window"
    producer.dlq_refuses = False
    got = [await asyncio.wait_for(delivered.get(), 10) for _ in range(2)]
    assert [(d.record.partition, d.record.offset) for d in got] == [(0, 7), (1, 3)]
    assert all(isinstance(d, Delivered) for d in got)
    actor.stop()
    await task


@pytest.mark.parametrize(
    "check, refused",
    [
        (TopicCheck(True, False, f"topic {DLQ!r} does not exist"), True),
        (TopicCheck(True, False, f"this worker's principal may not write topic {DLQ!r}"), True),
        (TopicCheck(True, True), False),
        (TopicCheck(False, False, "127.0.0.1:9: connection refused"), False),
    ],
)
async def test_the_first_start_refuses_a_dlq_it_cannot_write(
    monkeypatch: pytest.MonkeyPatch, check: TopicCheck, refused: bool
) -> None:
    actor, _, _ = emitter()
    actor._dlq_checked = False
    asked: list[str] = []

    async def topic_check(kafka: Any, topic: str) -> TopicCheck:
        asked.append(topic)
        return check

    monkeypatch.setattr(dead_letters_module, "topic_check", topic_check)
    if refused:
        with pytest.raises(KafkaUnusable, match=r"dead-letter topic: .*lane\.dlq"):
            await actor.run()
        return
    task = asyncio.create_task(actor.run())
    await until(lambda: asked)
    actor.stop()
    await task
    assert asked == [DLQ] and actor._dlq_checked is check.answered
