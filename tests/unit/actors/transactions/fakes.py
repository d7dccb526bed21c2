"""A transactional producer without a broker, the lanes' hooks as a recorder, and outcomes
built the way the emitter hands them to a lane (`TransactionalOutcomes.route`), for the unit
tests of `actors.transactions`. What a test reads back is what a read_committed consumer would see:
the records and offsets of committed transactions."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Literal

from aiokafka.errors import KafkaError
from aiokafka.structs import OffsetAndMetadata, RecordMetadata, TopicPartition

from actors.config import WorkerConfig
from actors.emit.planning import OutcomePlanner
from actors.emit.records import Pending
from actors.mail import Outcome, RecordRef
from actors.telemetry.tracing import start_request_spans
from actors.transactions.lane import LaneHooks
from messages.codec import JSON, Codec
from messages.request import GenerateRequest
from messages.result import GenerateResult
from tests.unit.actors.emit.fake_producer import EveryTopic

REQUESTS = "lane.requests"
REPLIES = "lane.replies"  # where the requests ask their results to go
RESULTS = "lane.results"  # the worker's results topic: where an error result goes instead
DLQ = "lane.dlq"
GROUP = "g"
TP = TopicPartition(REQUESTS, 0)

RESULT_CODEC = Codec(GenerateResult)


def worker_config(**overrides: Any) -> WorkerConfig:
    settings: dict[str, Any] = {
        "group": GROUP,
        "requests_topic": REQUESTS,
        "results_topic": RESULTS,
        "dlq_topic": DLQ,
        "exactly_once": True,
        "transaction_interval_ms": 1.0,
    }
    return WorkerConfig(**(settings | overrides))


def pending(
    offset: int,
    *,
    partition: int = 0,
    config: WorkerConfig | None = None,
    reply_topic: str = REPLIES,
) -> Pending:
    """An outcome for the record at `offset`, on its way to its partition's lane."""
    config = config or worker_config()
    request_id = f"r-{partition}-{offset}"
    outcome = Outcome(
        record=RecordRef(REQUESTS, partition, offset, 0),
        result=GenerateResult(id=request_id, text=f"answer {offset}"),
        reply_topic=reply_topic,
        content_type=JSON,
        request=GenerateRequest(id=request_id, prompt_token_ids=[5], max_new_tokens=2),
    )
    spans = start_request_spans(outcome, group=config.group)
    return Pending(outcome, spans, [], [], key=id(outcome))


@dataclass
class Sent:
    topic: str
    value: bytes
    key: bytes | None
    headers: list[tuple[str, bytes]]

    @property
    def result(self) -> GenerateResult:
        return RESULT_CODEC.decode(self.value, JSON)


@dataclass
class Transaction:
    sent: list[Sent] = field(default_factory=list)
    offsets: dict[TopicPartition, OffsetAndMetadata] = field(default_factory=dict)
    group_id: str | None = None
    state: Literal["open", "committed", "aborted"] = "open"


class FakeTxnManager:
    """The part of aiokafka's `TransactionManager` a lane reads."""

    def __init__(self, transactional_id: str | None) -> None:
        self.transactional_id = transactional_id
        self.pid_waited = False
        self.pid_error: BaseException | None = None  # `wait_for_pid` raises it
        self.fatal = False

    async def wait_for_pid(self) -> None:
        self.pid_waited = True
        if self.pid_error is not None:
            raise self.pid_error

    def is_fatal_error(self) -> bool:
        return self.fatal


class FakeAccumulator:
    """What of aiokafka's message accumulator a lane touches: failing what it holds."""

    def __init__(self) -> None:
        self.failed = asyncio.Event()

    def fail_all(self, exception: BaseException) -> None:
        self.failed.set()


class FakeTransactionalProducer:
    """Acknowledges every record at once, except those of a topic in `refuse` (their acks
    fail with its error); `commit_errors` are raised by the next commits, one each."""

    def __init__(self, transactional_id: str | None = None, events: list[str] | None = None):
        self._txn_manager = FakeTxnManager(transactional_id)
        self.client = SimpleNamespace(cluster=EveryTopic())  # cluster metadata, as aiokafka has it
        self.events = events if events is not None else []  # shared with the hooks: the order
        self.transactions: list[Transaction] = []
        self.refuse: dict[str, KafkaError] = {}
        self.commit_errors: list[BaseException] = []
        self.commit_gate: asyncio.Event | None = None  # set: commits go on
        self.committing = asyncio.Event()  # a commit has begun (and waits for the gate)
        self.started = False
        self.stopped = False
        # Set: `stop()` waits, as aiokafka's does for batches the broker never takes, until
        # what the producer holds is failed (`_message_accumulator.fail_all`).
        self.stop_holds = False
        self._message_accumulator = FakeAccumulator()

    @property
    def transactional_id(self) -> str | None:
        return self._txn_manager.transactional_id

    @property
    def current(self) -> Transaction:
        txn = self.transactions[-1]
        assert txn.state == "open", "no transaction is open"
        return txn

    def committed(self) -> list[Transaction]:
        return [t for t in self.transactions if t.state == "committed"]

    def states(self) -> list[str]:
        return [t.state for t in self.transactions]

    def committed_sent(self, topic: str | None = None) -> list[Sent]:
        """What a read_committed consumer reads (of `topic`, when given)."""
        return [s for t in self.committed() for s in t.sent if topic in (None, s.topic)]

    async def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        if self.stop_holds:
            await self._message_accumulator.failed.wait()
        self.stopped = True

    async def begin_transaction(self) -> None:
        assert not self.transactions or self.transactions[-1].state != "open"
        self.transactions.append(Transaction())
        self.events.append("begin")

    async def send(
        self, topic: str, value: bytes, key: bytes | None = None, headers: Any = None
    ) -> asyncio.Future[RecordMetadata]:
        txn = self.current
        txn.sent.append(Sent(topic, value, key, list(headers or [])))
        ack: asyncio.Future[RecordMetadata] = asyncio.get_running_loop().create_future()
        if topic in self.refuse:
            ack.set_exception(self.refuse[topic])
        else:
            tp = TopicPartition(topic, 0)
            ack.set_result(RecordMetadata(topic, 0, tp, len(txn.sent) - 1, 0, 0, 0))
        return ack

    async def send_offsets_to_transaction(
        self, offsets: dict[TopicPartition, OffsetAndMetadata], group_id: str
    ) -> None:
        txn = self.current
        txn.offsets.update(offsets)
        txn.group_id = group_id

    async def commit_transaction(self) -> None:
        txn = self.current
        self.committing.set()
        if self.commit_gate is not None:
            await self.commit_gate.wait()
        if self.commit_errors:
            raise self.commit_errors.pop(0)
        txn.state = "committed"
        self.events.append("commit")

    async def abort_transaction(self) -> None:
        self.current.state = "aborted"
        self.events.append("abort")


class RecordingHooks:
    """The lane's hooks, recording each settled outcome by its offset."""

    STARVED_AFTER = 100  # `metadata_full` counted this often without the loop taking a turn

    def __init__(self, events: list[str] | None = None) -> None:
        self.events = events if events is not None else []
        self.delivered: list[Pending] = []
        self.suppressed: list[Pending] = []
        self.dropped: list[Pending] = []
        self.blocked: list[Pending] = []
        self.waiting: list[Pending] = []
        self.lost: list[TopicPartition] = []  # lanes that died without a hand-off
        self.counts: Counter[str] = Counter()
        self._changed = asyncio.Event()
        self._unyielded = 0

    def lane_hooks(self) -> LaneHooks:
        return LaneHooks(
            delivered=self._settled(self.delivered, "delivered"),
            suppressed=self._settled(self.suppressed, "suppressed"),
            dropped=self._settled(self.dropped, "dropped"),
            blocked=self._settled(self.blocked, "blocked"),
            waiting=self._settled(self.waiting, "waiting"),
            count=self.count,
            lost=self._lost,
        )

    async def _lost(self, tp: TopicPartition, reason: str) -> None:
        self.lost.append(tp)
        self.events.append("lost")

    def _settled(self, into: list[Pending], name: str) -> Any:
        async def hook(p: Pending) -> None:
            into.append(p)
            self.events.append(f"{name} {p.outcome.record.offset}")
            self._changed.set()

        return hook

    def count(self, name: str) -> None:
        self.counts[name] += 1
        if name == "metadata_full":
            # A lane that counts this again and again without awaiting anything starves the
            # event loop (and would hang the test): fail it instead.
            self._unyielded += 1
            if self._unyielded == 1:
                asyncio.get_running_loop().call_soon(self._yielded)
            if self._unyielded > self.STARVED_AFTER:
                raise EventLoopStarved(f"metadata_full counted {self._unyielded} times in a row")

    def _yielded(self) -> None:
        self._unyielded = 0

    @staticmethod
    def offsets(ps: list[Pending]) -> list[int]:
        return [p.outcome.record.offset for p in ps]

    async def settled(self, n: int) -> None:
        """Until `n` outcomes were delivered, suppressed or dropped in all."""
        while len(self.delivered) + len(self.suppressed) + len(self.dropped) < n:
            self._changed.clear()
            await self._changed.wait()


class EventLoopStarved(Exception):
    """A lane looped without ever awaiting: nothing else could run."""


def planner() -> OutcomePlanner:
    return OutcomePlanner(count=lambda _: None)
