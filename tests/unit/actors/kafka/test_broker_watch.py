"""The broker watch: probe outcomes → reachability, one log line per change (fake clock and
fake admin clients; no broker)."""

from __future__ import annotations

import asyncio

from aiokafka.errors import KafkaConnectionError, NodeNotReadyError
from structlog.testing import capture_logs

from actors.health import Health
from actors.kafka.broker_watch import BrokerState, BrokerWatch, Change, iso_utc, observe
from actors.kafka.connection import KafkaConnection

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z


class Clock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_iso_utc() -> None:
    assert iso_utc(T0 + 61.9) == "2026-01-01T00:01:01Z"


def test_the_first_probe_decides_and_only_a_failure_is_logged() -> None:
    assert observe(BrokerState(), None, T0) == (BrokerState(reachable=True), None)
    assert observe(BrokerState(), "refused", T0) == (
        BrokerState(False, T0),
        Change("kafka_unreachable", {"since": "2026-01-01T00:00:00Z", "error": "refused"}),
    )


def test_an_outage_is_dated_from_its_first_failure_and_ends_at_the_first_success() -> None:
    up = BrokerState(reachable=True)
    down, change = observe(up, "refused", T0)
    assert down == BrokerState(False, T0) and change is not None
    assert observe(down, "timed out", T0 + 2) == (down, None)  # same outage, same since
    assert observe(up, None, T0 + 2) == (up, None)
    back, change = observe(down, None, T0 + 4.25)
    assert back == up
    assert change == Change("kafka_reachable", {"down_s": 4.25})


def test_a_clock_stepping_back_makes_no_negative_outage() -> None:
    _, change = observe(BrokerState(False, T0), None, T0 - 3)
    assert change == Change("kafka_reachable", {"down_s": 0.0})


def test_one_log_line_per_transition() -> None:
    clock = Clock()
    watch = BrokerWatch(KafkaConnection("broker:9092"), clock=clock)
    outcomes = [None, None, "refused", "refused", "refused", None, None, "reset", None]
    with capture_logs() as logs:
        for error in outcomes:
            watch.record(error)
            if error is not None:
                assert not watch.reachable
            clock.now += 2.0
    assert [(e["event"], e["log_level"]) for e in logs] == [
        ("kafka_unreachable", "warning"),
        ("kafka_reachable", "info"),
        ("kafka_unreachable", "warning"),
        ("kafka_reachable", "info"),
    ]
    assert logs[0]["since"] == iso_utc(T0 + 4) and logs[0]["error"] == "refused"
    assert logs[1]["down_s"] == 6.0  # from the first of its three failures
    assert all(e["bootstrap_servers"] == "broker:9092" for e in logs)
    assert watch.reachable and watch.unreachable_since is None


def test_with_no_broker_from_the_start_it_is_unreachable_and_says_so_once() -> None:
    watch = BrokerWatch(KafkaConnection(), clock=Clock())
    assert not watch.reachable and watch.unreachable_since is None  # not probed yet
    with capture_logs() as logs:
        for _ in range(5):
            watch.record("KafkaConnectionError('Unable to bootstrap')")
    assert [e["event"] for e in logs] == ["kafka_unreachable"]
    assert watch.unreachable_since == "2026-01-01T00:00:00Z"
    flags = _Up()
    ready, details = Health(flags, flags, None, watch).readiness()
    assert not ready and details["kafka"] == "unreachable since 2026-01-01T00:00:00Z"


class _Up:
    joined = model_loaded = True
    model_name = "m"


class FakeCluster:
    """Answers probe i as `outcomes[i]` says: None answers; a KafkaConnectionError fails the
    client's start (no bootstrap), another exception its describe_cluster(); "hang" never
    answers. Stops the watch once the last outcome is taken."""

    def __init__(self, outcomes: list[BaseException | str | None]) -> None:
        self.outcomes = outcomes
        self.clients: list[FakeClient] = []
        self.watch: BrokerWatch | None = None

    def client(self) -> FakeClient:
        self.clients.append(FakeClient(self))
        return self.clients[-1]

    def take(self) -> BaseException | str | None:
        outcome = self.outcomes.pop(0)
        if not self.outcomes and self.watch is not None:
            self.watch.stop()
        return outcome


class FakeClient:
    def __init__(self, cluster: FakeCluster) -> None:
        self.cluster = cluster
        self.closed = False

    async def start(self) -> None:
        if isinstance(self.cluster.outcomes[0], KafkaConnectionError):
            raise KafkaConnectionError(str(self.cluster.take()))

    async def describe_cluster(self) -> object:
        outcome = self.cluster.take()
        if outcome == "hang":
            await asyncio.Event().wait()
        if isinstance(outcome, BaseException):
            raise outcome
        return {"brokers": [{"node_id": 1}]}

    async def close(self) -> None:
        self.closed = True


async def test_run_probes_rebuilds_its_client_after_a_failure_and_never_crashes() -> None:
    cluster = FakeCluster(
        [
            KafkaConnectionError("Unable to bootstrap"),  # no broker from the start
            KafkaConnectionError("Unable to bootstrap"),
            None,
            None,
            NodeNotReadyError("node 1"),
            "hang",  # ended by the probe's timeout
            RuntimeError("a client half through its bootstrap"),
            None,
        ]
    )
    watch = BrokerWatch(KafkaConnection(), interval_s=0, timeout_s=0.05, admin=cluster.client)
    cluster.watch = watch
    with capture_logs() as logs:
        await asyncio.wait_for(watch.run(), 30)  # a hang bound only
    assert [e["event"] for e in logs] == [
        "kafka_unreachable",
        "kafka_reachable",
        "kafka_unreachable",
        "kafka_reachable",
    ]
    assert "Unable to bootstrap" in logs[0]["error"] and "NodeNotReady" in logs[2]["error"]
    assert watch.reachable
    # One client per run of successes, a new one after each failure; all closed at the end.
    assert len(cluster.clients) == 6 and all(c.closed for c in cluster.clients)


async def test_a_stop_before_run_returns_at_once_and_run_may_be_called_again() -> None:
    cluster = FakeCluster([None])
    watch = BrokerWatch(KafkaConnection(), interval_s=0, admin=cluster.client)
    watch.stop()
    await asyncio.wait_for(watch.run(), 30)
    assert cluster.clients == [] and watch.state == BrokerState()
    cluster.watch = watch
    await asyncio.wait_for(watch.run(), 30)
    assert watch.reachable and cluster.clients[0].closed
