"""One partition's transactions (`actors.transactions.lane`): its outcomes and its consumed
offset commit together, an offset answered already is never produced again, and a fenced
lane dies without writing. A fake transactional producer stands in for the broker; what a
test reads back is what a read_committed consumer would see."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Literal, cast

import pytest
from aiokafka.errors import (
    InvalidProducerEpoch,
    KafkaError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    ProducerFenced,
    TopicAuthorizationFailedError,
)
from aiokafka.structs import OffsetAndMetadata

import actors.transactions.lane as lane_module
from actors.transactions.answered import (
    MAX_METADATA_CHARS,
    RESERVE,
    SEPARATOR,
    AnsweredOffsets,
    split,
)
from actors.transactions.lane import Lane, LaneFenced
from messages.error_codes import ErrorCode
from messages.result import FinishReason
from tests.unit.actors.emit.fake_producer import MetadataProducer
from tests.unit.actors.transactions.fakes import (
    DLQ,
    GROUP,
    REPLIES,
    RESULTS,
    TP,
    FakeTransactionalProducer,
    RecordingHooks,
    pending,
    planner,
    worker_config,
)

NONE = AnsweredOffsets()


@dataclass
class Rig:
    lane: Lane
    producer: FakeTransactionalProducer
    hooks: RecordingHooks
    task: asyncio.Task[None]
    events: list[str]  # the producer's and the hooks' events, in order

    def add(self, *offsets: int) -> None:
        for offset in offsets:
            self.lane.add(pending(offset))

    def sent_offsets(self) -> list[int]:
        """The request offsets whose results a read_committed consumer reads."""
        return [int(s.result.id.rsplit("-", 1)[1]) for s in self.producer.committed_sent()]


@asynccontextmanager
async def running_lane(monkeypatch: pytest.MonkeyPatch, **config: Any) -> AsyncIterator[Rig]:
    """An opened lane with its `run()` task; stopped (and the task awaited) at the end.
    `config`: the worker's settings that differ from `worker_config()`'s."""
    monkeypatch.setattr(lane_module, "backoff_s", lambda attempt: 0.0)  # retries at once
    events: list[str] = []
    producer = FakeTransactionalProducer("tokenmill.g.lane.requests.0", events)
    hooks = RecordingHooks(events)
    lane = Lane(TP, cast(Any, producer), worker_config(**config), planner(), hooks.lane_hooks())
    lane._wakeup = WatchedWakeup()  # before `run()` waits on it
    await lane.open()
    task = asyncio.create_task(lane.run())
    try:
        yield Rig(lane, producer, hooks, task, events)
    finally:
        await lane.stop()
        await task


class WatchedWakeup(asyncio.Event):
    """The lane's wake-up event, telling each time the lane waits on it: it has then looked at
    what it holds and found nothing to do yet."""

    def __init__(self) -> None:
        super().__init__()
        self.waited = asyncio.Event()

    async def wait(self) -> Literal[True]:
        self.waited.set()
        return await super().wait()


async def until_idle(lane: Lane) -> None:
    """Until the lane, woken, has looked at what it holds and waits again."""
    wakeup = cast(WatchedWakeup, lane._wakeup)
    wakeup.waited.clear()
    await wakeup.waited.wait()


# -- one transaction: the outcomes, then the offset ---------------------------------------


async def test_outcomes_added_then_woken_commit_in_one_transaction_with_the_offset(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with running_lane(monkeypatch) as rig:
        assert rig.producer.started and rig.producer._txn_manager.pid_waited
        rig.lane.start(10, "tokenmill/1 held 10 0 0", NONE)
        rig.add(10, 11, 13)
        rig.lane.wake()
        await rig.hooks.settled(3)

    [txn] = rig.producer.transactions
    assert txn.state == "committed" and txn.group_id == GROUP
    assert [s.topic for s in txn.sent] == [REPLIES] * 3
    assert rig.sent_offsets() == [10, 11, 13]
    [(tp, written)] = txn.offsets.items()
    assert tp == TP and written.offset == 10
    guard, answered = split(written.metadata, written.offset)
    assert guard == "tokenmill/1 held 10 0 0"
    assert list(answered) == [10, 11, 13]
    assert rig.hooks.offsets(rig.hooks.delivered) == [10, 11, 13]
    assert rig.events == ["begin", "commit", "delivered 10", "delivered 11", "delivered 13"]
    assert rig.lane.transactions == 1


async def test_a_commit_writes_the_commit_point_asked_for_with_the_answered_offsets_above_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with running_lane(monkeypatch) as rig:
        rig.lane.start(10, "guard-0", NONE)
        rig.add(12, 14)
        assert await rig.lane.commit(11, "guard-1") is True
        # reported delivered before the commit request is answered
        assert rig.hooks.offsets(rig.hooks.delivered) == [12, 14]

    [txn] = rig.producer.transactions
    assert txn.state == "committed"
    assert txn.offsets == {TP: OffsetAndMetadata(11, f"guard-1{SEPARATOR}1,3")}
    guard, answered = split(txn.offsets[TP].metadata, 11)
    assert (guard, list(answered)) == ("guard-1", [12, 14])
    assert rig.events == ["begin", "commit", "delivered 12", "delivered 14"]


async def test_a_commit_with_nothing_waiting_writes_the_offset_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with running_lane(monkeypatch) as rig:
        rig.lane.start(3, "guard-0", NONE)
        assert await rig.lane.commit(7, "guard-1") is True

    [txn] = rig.producer.transactions
    assert txn.state == "committed" and txn.sent == []
    assert txn.offsets == {TP: OffsetAndMetadata(7, "guard-1")}


# -- answered already: never produced again -----------------------------------------------


async def test_outcomes_below_the_commit_point_or_answered_at_start_are_suppressed_unsent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with running_lane(monkeypatch) as rig:
        rig.lane.start(10, "guard", AnsweredOffsets([3, 12, 13]))
        rig.add(9, 12, 14)
        rig.lane.wake()
        await rig.hooks.settled(3)

    assert rig.sent_offsets() == [14]
    assert rig.hooks.offsets(rig.hooks.suppressed) == [9, 12]
    assert rig.hooks.offsets(rig.hooks.delivered) == [14]
    assert rig.hooks.counts["duplicate_suppressed"] == 2
    # the answered set read at start is written again, with the new answer
    [txn] = rig.producer.transactions
    assert txn.offsets == {TP: OffsetAndMetadata(10, f"guard{SEPARATOR}2-4")}


async def test_an_offset_committed_by_an_earlier_transaction_is_not_produced_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with running_lane(monkeypatch) as rig:
        rig.lane.start(0, "guard", NONE)
        rig.add(3)
        rig.lane.wake()
        await rig.hooks.settled(1)
        replay = pending(3)  # the record read again (a rebalance, a zombie's copy)
        rig.lane.add(replay)
        rig.lane.wake()
        await rig.hooks.settled(2)

    assert len(rig.producer.transactions) == 1
    assert rig.sent_offsets() == [3]
    assert rig.hooks.suppressed == [replay]


async def test_two_outcomes_for_one_offset_in_a_batch_produce_one_and_suppress_the_other(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first, copy = pending(4), pending(4)
    async with running_lane(monkeypatch) as rig:
        rig.lane.start(0, "guard", NONE)
        rig.lane.add(first)
        rig.lane.add(copy)
        rig.lane.wake()
        await rig.hooks.settled(2)

    assert rig.sent_offsets() == [4]
    assert rig.hooks.delivered == [first] and rig.hooks.suppressed == [copy]
    assert rig.events == ["begin", "commit", "delivered 4", "suppressed 4"]


# -- no commit point yet ------------------------------------------------------------------


async def test_outcomes_wait_without_a_commit_point_and_go_with_the_first_commit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with running_lane(monkeypatch) as rig:
        rig.lane.start(None, "", NONE)  # the partition was never committed
        rig.add(5, 6)
        rig.lane.wake()
        await until_idle(rig.lane)
        assert rig.producer.transactions == []
        assert rig.lane.waiting.keys() == {5, 6}

        assert await rig.lane.commit(5, "guard") is True

    [txn] = rig.producer.transactions
    assert rig.sent_offsets() == [5, 6]
    assert txn.offsets == {TP: OffsetAndMetadata(5, f"guard{SEPARATOR}0-1")}
    assert rig.hooks.offsets(rig.hooks.delivered) == [5, 6]


# -- fenced: the lane dies ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "fatal"),
    [
        (ProducerFenced(), False),
        (InvalidProducerEpoch(), False),
        (KafkaTimeoutError(), True),  # any error once the producer is in a fatal state
    ],
    ids=["fenced", "invalid-epoch", "fatal-state"],
)
async def test_a_fenced_commit_kills_the_lane_and_drops_what_waited(
    monkeypatch: pytest.MonkeyPatch, error: KafkaError, fatal: bool
) -> None:
    async with running_lane(monkeypatch) as rig:
        rig.producer.commit_errors = [error]
        rig.producer._txn_manager.fatal = fatal
        rig.lane.start(0, "guard", NONE)
        rig.add(0, 1)
        assert await rig.lane.commit(0, "guard") is False
        await rig.task  # it ends on its own

        assert rig.lane.dead and rig.lane.closed.is_set() and rig.producer.stopped
        assert rig.hooks.offsets(rig.hooks.dropped) == [0, 1]
        assert await rig.lane.commit(2, "guard") is False
        with pytest.raises(LaneFenced):
            rig.lane.add(pending(2))

    assert len(rig.producer.transactions) == 1  # no transaction after it
    assert rig.producer.committed() == []
    assert "abort" not in rig.events  # a fenced producer cannot abort: the broker does
    assert rig.hooks.delivered == [] and rig.hooks.counts["lane_fenced"] == 1
    # Told after what it dropped: an ingest still holding the partition rejoins the group.
    assert rig.hooks.lost == [TP] and rig.events[-1] == "lost"


async def test_a_transaction_that_never_ends_gives_the_producer_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """aiokafka waits for a commit without limit; one the broker will never answer (it ended
    the transaction meanwhile) kills the lane past the transaction and delivery timeouts, so
    that the partition's next owner opens a new producer."""
    async with running_lane(monkeypatch, transaction_timeout_ms=20, delivery_timeout_ms=20) as rig:
        rig.producer.commit_gate = asyncio.Event()  # never set: the commit never ends
        rig.lane.start(0, "guard", NONE)
        rig.add(0)
        assert await rig.lane.commit(0, "guard") is False
        await rig.task

    assert rig.lane.dead and rig.producer.committed() == []
    assert rig.hooks.offsets(rig.hooks.dropped) == [0]
    assert rig.hooks.lost == [TP] and rig.hooks.counts["lane_fenced"] == 1


async def test_a_producer_that_cannot_flush_is_closed_all_the_same(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A transactional producer's stop waits for every batch it holds, and never gives one up:
    past the delivery timeout the lane fails them, so that its close (and the hand-off, and the
    worker's exit) ends."""
    async with running_lane(monkeypatch, delivery_timeout_ms=20) as rig:
        rig.producer.stop_holds = True
        await rig.lane.stop()
        await rig.task

    assert rig.lane.closed.is_set() and rig.producer.stopped
    assert rig.hooks.lost == []  # stopped (a hand-off), not lost


# -- refused and transient failures -------------------------------------------------------


@pytest.mark.parametrize(
    ("refusal", "code"),
    [
        (MessageSizeTooLargeError(), ErrorCode.RESULT_TOO_LARGE),
        (TopicAuthorizationFailedError(), ErrorCode.REPLY_TO_REFUSED),
    ],
    ids=["too-large", "not-authorized"],
)
async def test_a_refused_result_is_aborted_and_answered_instead_in_the_next_transaction(
    monkeypatch: pytest.MonkeyPatch, refusal: KafkaError, code: ErrorCode
) -> None:
    p = pending(0)
    async with running_lane(monkeypatch) as rig:
        rig.producer.refuse[REPLIES] = refusal
        rig.lane.start(0, "guard", NONE)
        rig.lane.add(p)
        rig.lane.wake()
        await rig.hooks.settled(1)

    aborted, committed = rig.producer.transactions
    assert (aborted.state, committed.state) == ("aborted", "committed")
    assert [s.topic for s in aborted.sent] == [REPLIES]
    assert aborted.offsets == {}  # the offset is written only with the answer
    assert [s.topic for s in committed.sent] == [RESULTS, DLQ]
    answer = committed.sent[0].result
    assert answer.id == "r-0-0" and answer.finish_reason == FinishReason.ERROR
    assert answer.error is not None and answer.error.code == code
    assert committed.offsets == {TP: OffsetAndMetadata(0, f"guard{SEPARATOR}0")}
    assert rig.hooks.delivered == [p] and p.answered == code
    assert rig.events == ["begin", "abort", "begin", "commit", "delivered 0"]
    assert rig.hooks.counts["transaction_aborted"] == 1


async def test_a_transient_failure_aborts_and_the_same_outcomes_commit_next_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with running_lane(monkeypatch) as rig:
        rig.producer.commit_errors = [KafkaTimeoutError()]
        rig.lane.start(0, "guard", NONE)
        rig.add(0, 1)
        assert await rig.lane.commit(0, "guard") is True

    aborted, committed = rig.producer.transactions
    assert (aborted.state, committed.state) == ("aborted", "committed")
    assert [s.value for s in aborted.sent] == [s.value for s in committed.sent]
    assert rig.sent_offsets() == [0, 1]
    assert committed.offsets == {TP: OffsetAndMetadata(0, f"guard{SEPARATOR}0-1")}
    assert rig.hooks.offsets(rig.hooks.delivered) == [0, 1]
    assert rig.events == ["begin", "abort", "begin", "commit", "delivered 0", "delivered 1"]
    assert rig.hooks.counts["transaction_retried"] == 1
    assert rig.hooks.counts["transaction_aborted"] == 1


# -- a release: the last transaction, then close ------------------------------------------


async def test_a_release_commits_what_waits_then_closes_and_drops_what_comes_after(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with running_lane(monkeypatch) as rig:
        rig.producer.commit_gate = asyncio.Event()
        rig.lane.start(None, "", NONE)  # no commit point: 0 and 1 wait for the release's
        rig.add(0, 1)
        release = asyncio.create_task(rig.lane.commit(0, "guard", release=True))
        await rig.producer.committing.wait()
        assert rig.lane.releasing
        late = pending(2)  # finished while the last transaction commits
        rig.lane.add(late)
        rig.producer.commit_gate.set()

        assert await release is True
        await rig.lane.closed.wait()
        assert rig.producer.stopped and rig.lane.dead
        assert rig.hooks.offsets(rig.hooks.delivered) == [0, 1]
        assert rig.hooks.dropped == [late]
        with pytest.raises(LaneFenced):
            rig.lane.add(pending(3))
        assert await rig.lane.commit(3, "guard") is False

    [txn] = rig.producer.transactions
    assert txn.state == "committed" and rig.sent_offsets() == [0, 1]


# -- the metadata's limit -----------------------------------------------------------------

# Leaves 20 characters for the answered offsets past the reserve kept for the offset at the
# commit point: "1,3,5,7,9,11,13,15" (18) is the most.
LONG_GUARD = "g" * (MAX_METADATA_CHARS - RESERVE - len(SEPARATOR) - 20)
SCATTERED = list(range(1, 40, 2))  # every other offset above the commit point 0


async def test_a_release_takes_only_the_outcomes_whose_offsets_fit_the_metadata(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with running_lane(monkeypatch) as rig:
        rig.lane.start(0, LONG_GUARD, NONE)
        rig.add(*SCATTERED)
        assert await rig.lane.commit(0, LONG_GUARD, release=True) is True
        await rig.lane.closed.wait()

    [txn] = rig.producer.transactions
    written = txn.offsets[TP]
    assert len(written.metadata) <= MAX_METADATA_CHARS
    guard, answered = split(written.metadata, 0)
    assert guard == LONG_GUARD
    sent = rig.sent_offsets()
    assert sent == [1, 3, 5, 7, 9, 11, 13, 15]
    assert list(answered) == sent == rig.hooks.offsets(rig.hooks.delivered)
    assert rig.hooks.offsets(rig.hooks.dropped) == SCATTERED[len(sent) :]  # the next owner's
    assert rig.hooks.counts["metadata_full"] == 1


async def test_outcomes_that_do_not_fit_the_metadata_wait_for_the_commit_point_to_catch_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with running_lane(monkeypatch) as rig:
        rig.lane.start(0, LONG_GUARD, NONE)
        rig.add(*SCATTERED)
        rig.lane.wake()
        await rig.hooks.settled(8)

        assert not rig.task.done(), "the lane's task ended"
        sent = rig.sent_offsets()
        assert sent == [1, 3, 5, 7, 9, 11, 13, 15]
        assert sorted(rig.lane.waiting) == SCATTERED[len(sent) :]
        assert rig.hooks.counts["metadata_full"] >= 1

        # the ingest's commit point passes what was delivered: room for the next ones
        assert await rig.lane.commit(16, LONG_GUARD) is True
        assert await rig.lane.commit(32, LONG_GUARD) is True
        await rig.hooks.settled(len(SCATTERED))

    assert rig.sent_offsets() == SCATTERED
    assert rig.hooks.offsets(rig.hooks.delivered) == SCATTERED
    for txn in rig.producer.committed():
        assert len(txn.offsets[TP].metadata) <= MAX_METADATA_CHARS


async def test_the_outcome_at_the_commit_point_goes_even_when_the_metadata_is_full(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """It is what lets the commit point move on: held back, the lane would wait forever."""
    full = "g" * (MAX_METADATA_CHARS - len(SEPARATOR) - 3)
    async with running_lane(monkeypatch) as rig:
        rig.lane.start(0, full, NONE)
        rig.add(5, 0)
        rig.lane.wake()
        await rig.hooks.settled(1)
        assert rig.sent_offsets() == [0]
        assert sorted(rig.lane.waiting) == [5]


# -- a reply topic the lane's producer does not know ------------------------------------------

OTHER = "lane.other"  # a reply topic the producer knows


def metadata(rig: Rig, broker: set[str]) -> MetadataProducer:
    """The lane's producer knows RESULTS, DLQ and OTHER; the broker has `broker`."""
    meta = MetadataProducer({RESULTS, DLQ, OTHER}, broker=broker)
    rig.producer.client = meta.client
    rig.producer.partitions_for = meta.partitions_for  # type: ignore[attr-defined]
    return meta


async def test_an_outcome_for_an_unknown_topic_waits_apart_and_the_others_commit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    waits, goes = pending(0), pending(1, reply_topic=OTHER)
    async with running_lane(monkeypatch, topic_metadata_wait_ms=3_600_000.0) as rig:
        meta = metadata(rig, broker={RESULTS, DLQ, OTHER})
        rig.lane.start(0, "guard", NONE)
        rig.lane.add(waits)
        rig.lane.add(goes)
        rig.lane.wake()
        await rig.hooks.settled(1)
        assert rig.hooks.delivered == [goes] and 0 in rig.lane.awaiting
        assert [s.topic for s in rig.producer.committed_sent()] == [OTHER]
        meta.appear(REPLIES)  # the topic is made: its outcome goes in the next transaction
        await rig.hooks.settled(2)
    assert rig.hooks.delivered == [goes, waits]
    assert [s.topic for s in rig.producer.committed_sent()] == [OTHER, REPLIES]
    assert "abort" not in rig.events, "nothing waited inside a transaction"
    assert rig.hooks.waiting == [waits], "the ingest is told it is not running"


async def test_an_outcome_for_a_topic_not_on_the_broker_is_answered_instead_after_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    p = pending(0)
    async with running_lane(monkeypatch, topic_metadata_wait_ms=10.0) as rig:
        metadata(rig, broker={RESULTS, DLQ, OTHER})
        rig.lane.start(0, "guard", NONE)
        rig.lane.add(p)
        rig.lane.wake()
        await rig.hooks.settled(1)
    (committed,) = rig.producer.committed()
    assert [s.topic for s in committed.sent] == [RESULTS, DLQ]
    answer = committed.sent[0].result
    assert answer.error is not None and answer.error.code == ErrorCode.REPLY_TO_REFUSED
    assert REPLIES in answer.error.message and p.answered == ErrorCode.REPLY_TO_REFUSED
