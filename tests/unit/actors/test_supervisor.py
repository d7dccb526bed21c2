"""The supervisor: restarts a child that crashes (the GPU actor after giving back what it
held), gives up past its restart limit or on a setting that restarting cannot fix, and stops
its children in order on a drain. Fake children: the supervisor only runs, stops and counts
them."""

from __future__ import annotations

import asyncio
import errno
from typing import Any, cast

import pytest

from actors.config import WorkerConfig
from actors.kafka.errors import KafkaUnusable
from actors.mail import VerifiedCommand
from actors.restart_policy import RestartPolicy
from actors.supervisor import Supervisor
from messages.control import Drain
from messages.events import (
    ChildRestarted,
    Event,
    WorkerDraining,
    WorkerStarted,
    WorkerStopped,
)
from messages.result import ModelRef


class FakeChild:
    """Crashes with each of `crashes` in turn, then runs until stopped. `log` is shared by a
    rig's children: what happened to whom, in order."""

    def __init__(self, name: str, log: list[str], crashes: list[Exception] | None = None) -> None:
        self.name = name
        self.log = log
        self.crashes = list(crashes or [])
        self.crash_forever: Exception | None = None
        self.runs = 0
        self.up = asyncio.Event()  # running (after its last crash)
        self.stopping = asyncio.Event()
        self.cancelled = False

    async def run(self) -> None:
        self.runs += 1
        self.log.append(f"run {self.name}")
        if self.crash_forever is not None:
            raise self.crash_forever
        if self.crashes:
            raise self.crashes.pop(0)
        self.up.set()
        try:
            await self.stopping.wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        self.log.append(f"returned {self.name}")

    def stop(self) -> None:
        self.log.append(f"stop {self.name}")
        self.stopping.set()


class FakeIngest(FakeChild):
    records_read = 0
    outstanding = 0
    joined = True


class FakeGpu(FakeChild):
    running = 0
    failed_on_shutdown = 0
    kv_blocks = (0, 0)
    standby = None
    model_loaded = True
    model_name = "tiny"
    front = type(
        "Front", (), {"ref": ModelRef(name="tiny", digest="sha-tiny"), "max_model_len": 64}
    )()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.held: list[object] = []  # what `recover` gives back, answered by the emitter

    def recover(self) -> list[object]:
        self.log.append("recover gpu")
        held, self.held = self.held, []
        return held

    async def fail_queued(self) -> None:
        pass

    async def send(self, message: object) -> None:
        pass


class FakeEmitter(FakeChild):
    results_sent = 0
    dead_letters_sent = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.received: list[object] = []

    async def send(self, message: object) -> None:
        self.received.append(message)


class FakeControl(FakeChild):
    """Also the events publisher: keeps every event it is sent."""

    listening = True
    closed = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.events: list[Event] = []

    def try_send(self, event: Event) -> bool:
        self.events.append(event)
        return True

    def of(self, kind: type[Event]) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]


class Rig:
    def __init__(
        self, max_restarts: int = 3, guards: tuple[str, ...] = (), **crashes: list[Exception]
    ) -> None:
        self.log: list[str] = []
        self.guards = [FakeChild(name, self.log) for name in guards]
        self.ingest = FakeIngest("ingest", self.log, crashes.get("ingest"))
        self.gpu = FakeGpu("gpu", self.log, crashes.get("gpu"))
        self.emitter = FakeEmitter("emitter", self.log, crashes.get("emitter"))
        self.control = FakeControl("control", self.log, crashes.get("control"))
        self.http = FakeChild("http", self.log, crashes.get("http"))
        self.restarted: list[str] = []
        config = WorkerConfig(
            worker_id="w1", max_restarts=max_restarts, restart_window_s=60.0, http_port=0
        )
        self.supervisor = Supervisor(
            config,
            cast(Any, self.ingest),
            cast(Any, self.gpu),
            cast(Any, self.emitter),
            control=cast(Any, self.control),
            http=cast(Any, self.http),
            on_restart=self.restarted.append,
            guards=cast(Any, self.guards),
        )
        # The same limit, without the pauses between restarts.
        self.supervisor.policy = RestartPolicy(max_restarts, 60.0, initial_backoff_s=0.0)
        self.children = [self.ingest, self.gpu, self.emitter, self.control, self.http]
        self.children += self.guards

    async def all_up(self) -> None:
        for child in self.children:
            await child.up.wait()


async def test_a_drain_stops_the_children_in_order_and_exits_zero() -> None:
    rig = Rig()
    running = asyncio.create_task(rig.supervisor.run())
    await rig.supervisor.started.wait()
    await rig.all_up()
    assert rig.control.of(WorkerStarted)[0].model == ModelRef(name="tiny", digest="sha-tiny")

    rig.supervisor.drain()
    await running
    stops = [line for line in rig.log if line.startswith("stop")]
    assert stops == ["stop ingest", "stop gpu", "stop emitter", "stop control", "stop http"]
    assert rig.log.index("returned ingest") < rig.log.index("stop gpu"), "ingest finishes first"
    assert rig.log.index("returned gpu") < rig.log.index("stop emitter"), "every outcome emitted"
    assert all(f"returned {c.name}" in rig.log for c in rig.children), "none was cancelled"
    assert rig.supervisor.exit_code == 0 and rig.supervisor.given_up == set()
    assert rig.supervisor.health.draining
    assert len(rig.control.of(WorkerDraining)) == 1 and len(rig.control.of(WorkerStopped)) == 1
    assert rig.control.of(WorkerDraining)[0].reason == "signal"
    assert rig.control.of(ChildRestarted) == [] and rig.restarted == []


async def test_a_drain_command_drains_and_a_second_drain_changes_nothing() -> None:
    rig = Rig()
    running = asyncio.create_task(rig.supervisor.run())
    await rig.supervisor.started.wait()
    await rig.supervisor.send(VerifiedCommand(Drain(), nonce="n-1"))
    await running
    rig.supervisor.drain("signal")  # a late SIGTERM
    draining = rig.control.of(WorkerDraining)
    assert [(e.reason, e.command) for e in draining] == [("drain command", "n-1")]
    assert rig.control.of(WorkerStopped)[0].command == "n-1"
    assert rig.supervisor.exit_code == 0


async def test_a_crashed_child_is_restarted_and_the_worker_goes_on() -> None:
    rig = Rig(max_restarts=3, ingest=[RuntimeError("one"), RuntimeError("two")])
    running = asyncio.create_task(rig.supervisor.run())
    await rig.all_up()
    assert rig.ingest.runs == 3 and rig.restarted == ["ingest", "ingest"]
    assert rig.supervisor.down == set(), "up again after its restart"
    restarts = rig.control.of(ChildRestarted)
    assert [(e.child, e.restarts) for e in restarts] == [("ingest", 1), ("ingest", 2)]
    assert "RuntimeError('one')" in restarts[0].error
    assert all(c.runs == 1 for c in rig.children if c is not rig.ingest), "one-for-one"
    rig.supervisor.drain()
    await running
    assert rig.supervisor.exit_code == 0 and rig.supervisor.status().restarts == 2


async def test_a_crashed_gpu_actor_gives_back_what_it_held_before_running_again() -> None:
    rig = Rig(gpu=[RuntimeError("step failed")])
    lost = object()  # an outcome `recover` answers (a request that crashed it twice)
    rig.gpu.held = [lost]
    running = asyncio.create_task(rig.supervisor.run())
    await rig.all_up()
    gpu_lines = [line for line in rig.log if line.endswith(" gpu")]
    assert gpu_lines == ["run gpu", "recover gpu", "run gpu"]
    assert rig.emitter.received == [lost], "its answer reaches the emitter"
    rig.supervisor.drain()
    await running
    assert rig.supervisor.exit_code == 0


@pytest.mark.parametrize("core", ["ingest", "gpu", "emitter"])
async def test_a_core_actor_crashing_past_the_limit_stops_the_worker_non_zero(core: str) -> None:
    rig = Rig(max_restarts=2)
    crashing = next(c for c in rig.children if c.name == core)
    crashing.crash_forever = RuntimeError("always")
    await rig.supervisor.run()  # returns by itself: it gives up and drains
    assert crashing.runs == 3, "two restarts, then no more"
    assert rig.supervisor.given_up == {core} and rig.supervisor.exit_code == 1
    assert [e.restarts for e in rig.control.of(ChildRestarted)] == [1, 2]
    assert core in rig.control.of(WorkerDraining)[0].reason
    others = [c for c in (rig.ingest, rig.gpu) if c is not crashing]
    assert all(c.cancelled for c in others), "in-flight work is left uncommitted, unanswered"
    assert rig.control.stopping.is_set() and rig.http.stopping.is_set()


async def test_a_side_child_crashing_past_the_limit_drains_the_core_in_order() -> None:
    rig = Rig(max_restarts=1)
    rig.http.crash_forever = RuntimeError("always")
    await rig.supervisor.run()
    assert rig.http.runs == 2 and rig.supervisor.given_up == {"http"}
    assert rig.supervisor.exit_code == 1
    stops = [line for line in rig.log if line.startswith("stop")]
    assert stops[:3] == ["stop ingest", "stop gpu", "stop emitter"], "a normal drain"
    assert not rig.ingest.cancelled and not rig.gpu.cancelled


async def test_an_unusable_kafka_setting_is_not_restarted() -> None:
    rig = Rig(emitter=[KafkaUnusable("dead-letter topic: topic 'dlq' does not exist")])
    await rig.supervisor.run()
    assert rig.emitter.runs == 1 and rig.restarted == []
    assert rig.supervisor.given_up == {"emitter"} and rig.supervisor.exit_code == 1
    assert "does not exist" in rig.control.of(WorkerDraining)[0].reason
    assert rig.control.of(ChildRestarted) == []


async def test_an_http_port_that_cannot_be_bound_stops_the_worker_without_a_restart() -> None:
    rig = Rig(http=[OSError(errno.EADDRINUSE, "address already in use")])
    await rig.supervisor.run()
    assert rig.http.runs == 1 and rig.restarted == []
    assert rig.supervisor.exit_code == 1
    assert "cannot serve HTTP" in rig.control.of(WorkerDraining)[0].reason
    assert "returned emitter" in rig.log, "the core drains normally"


async def test_a_hung_engine_leaves_without_waiting_for_it_not_live_and_non_zero() -> None:
    rig = Rig(guards=("watchdog", "memory_guard"))
    running = asyncio.create_task(rig.supervisor.run())
    await rig.all_up()
    reason = "engine step running for 31.0 s, over its bound of 30.0 s"
    rig.supervisor.engine_stalled(reason)
    await running
    assert rig.supervisor.health.liveness() == (False, {"status": "stalled", "reason": reason})
    assert rig.supervisor.exit_code == 1 and rig.supervisor.given_up == {"gpu"}
    assert rig.ingest.cancelled and rig.gpu.cancelled, "neither is waited for: nothing answered"
    assert "returned emitter" in rig.log, "what was answered reaches the broker"
    assert "engine hung" in rig.control.of(WorkerDraining)[0].reason
    assert all(g.stopping.is_set() and f"returned {g.name}" in rig.log for g in rig.guards)


async def test_the_guards_run_beside_the_actors_and_stop_last_on_a_drain() -> None:
    rig = Rig(guards=("watchdog", "memory_guard"))
    running = asyncio.create_task(rig.supervisor.run())
    await rig.all_up()
    rig.supervisor.drain("resident memory 9 bytes is over --max-rss 8")
    await running
    stops = [line for line in rig.log if line.startswith("stop")]
    assert stops[-2:] == ["stop watchdog", "stop memory_guard"]
    assert rig.supervisor.exit_code == 0 and rig.supervisor.health.liveness()[0]
    assert "--max-rss" in rig.control.of(WorkerDraining)[0].reason
