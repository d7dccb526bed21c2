"""Watchdog: notices an engine step that never returns, and hands the worker to `on_stall`.

An engine can hang inside a step (a deadlocked collective, a driver fault, a kernel that
never ends) while the event loop, Kafka and `/healthz` carry on as if all were well. The
engine thread reports each step's start and end (`StepProgress`); this child reads them a few
times per bound and, once a step has run past its bound, calls `on_stall(reason)` once
(the supervisor then reports not-live, leaves the group without waiting for the engine, and
exits non-zero) and returns. Work waiting behind a slow broker is not a stall: only a step
that has not come back is.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import structlog

from actors.guards.step_progress import StepProgress

log = structlog.get_logger("tokenmill.watchdog")

TICKS_PER_BOUND = 10
MIN_TICK_S, MAX_TICK_S = 0.05, 1.0


class Watchdog:
    """Checks `progress` until `stop()` or a stall; `run()` may be called again after a stop.

    `on_stall(reason)`: called once, on the event loop, when a step ran past its bound.
    `on_check(running_s, bound_s)`: each check's view, for metrics. `clock`: the monotonic
    clock the engine thread reports with.
    """

    def __init__(
        self,
        progress: StepProgress,
        on_stall: Callable[[str], None],
        *,
        on_check: Callable[[float, float], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = "watchdog"  # as the supervisor names its children
        self.progress = progress
        self.on_stall = on_stall
        self.on_check = on_check
        self.clock = clock
        self.stalled: str | None = None  # why, once a stall was found
        self._stopping = asyncio.Event()

    def stop(self) -> None:
        self._stopping.set()

    async def run(self) -> None:
        try:
            while not self._stopping.is_set() and self.check() is None:
                tick = min(max(self.progress.bound_s / TICKS_PER_BOUND, MIN_TICK_S), MAX_TICK_S)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), tick)
        finally:
            self._stopping.clear()

    def check(self) -> str | None:
        """One look at the engine: why it is hung (`on_stall` called), or None."""
        if self.stalled is not None:
            return self.stalled
        now = self.clock()
        progress = self.progress
        if self.on_check is not None:
            self.on_check(progress.running_for(now), progress.bound_s)
        reason = progress.stalled(now)
        if reason is None:
            return None
        self.stalled = reason
        log.error(
            "engine_stalled",
            reason=reason,
            running_s=round(progress.running_for(now), 3),
            bound_s=round(progress.bound_s, 3),
            steps=progress.steps,
        )
        self.on_stall(reason)
        return reason
