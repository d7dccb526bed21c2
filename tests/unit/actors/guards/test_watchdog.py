"""The watchdog hands a hung engine to `on_stall` once, then stops looking; a healthy engine,
busy or idle, is left alone. Steps are simulated by setting `running_since` on a fake clock."""

from __future__ import annotations

import asyncio

from structlog.testing import capture_logs

from actors.guards.step_progress import StepProgress
from actors.guards.watchdog import Watchdog


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def rig(floor_s: float = 2.0) -> tuple[Clock, StepProgress, Watchdog, list[str], list[tuple]]:
    clock = Clock()
    progress = StepProgress(floor_s=floor_s, multiple=10.0, clock=clock)
    stalls: list[str] = []
    checks: list[tuple[float, float]] = []
    watchdog = Watchdog(progress, stalls.append, on_check=lambda *c: checks.append(c), clock=clock)
    return clock, progress, watchdog, stalls, checks


def test_idle_and_steps_within_the_bound_are_not_stalls() -> None:
    clock, progress, watchdog, stalls, checks = rig()
    assert watchdog.check() is None, "idle"
    progress.running_since = clock.now
    clock.now += 2.0
    assert watchdog.check() is None, "running, at the bound"
    assert stalls == [] and checks == [(0.0, 2.0), (2.0, 2.0)]


def test_a_step_past_its_bound_is_a_stall_reported_once() -> None:
    clock, progress, watchdog, stalls, _ = rig()
    progress.running_since = clock.now
    clock.now += 3.0
    with capture_logs() as logs:
        reason = watchdog.check()
        assert watchdog.check() == reason, "the same answer, and no second call"
    assert reason == "engine step running for 3.0 s, over its bound of 2.0 s"
    assert stalls == [reason] and watchdog.stalled == reason
    (event,) = [e for e in logs if e["event"] == "engine_stalled"]
    assert event["log_level"] == "error"
    assert (event["running_s"], event["bound_s"], event["steps"]) == (3.0, 2.0, 0)


async def test_run_returns_after_a_stall_and_at_stop() -> None:
    clock, progress, watchdog, stalls, _ = rig()
    progress.running_since = clock.now - 5.0  # hung before the watchdog first looks
    await asyncio.wait_for(watchdog.run(), 5.0)  # a hang bound only
    assert len(stalls) == 1

    clock, progress, watchdog, stalls, _ = rig()
    looked = asyncio.Event()
    watchdog.on_check = lambda *_: looked.set()
    running = asyncio.create_task(watchdog.run())
    await asyncio.wait_for(looked.wait(), 5.0)  # its first look
    watchdog.stop()
    await asyncio.wait_for(running, 5.0)
    assert stalls == []
