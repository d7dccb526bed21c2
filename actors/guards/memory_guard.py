"""MemoryGuard: samples the worker's resident set, exports its growth, drains past `--max-rss`.

A slow leak (host buffers kept by mistake, a cache without a bound, fragmentation) ends in an
out-of-memory kill: every request in flight is lost to a crash and the crash guard counts it
against them. This child samples the RSS every `interval_s`; past `limit` it calls
`on_over(reason)` once (the supervisor's graceful drain: stop fetching, finish in-flight work,
commit, exit 0), so the restart is a planned one, and with static membership no rebalance.
No limit: it only measures. Where the RSS cannot be read (no /proc), it says so once and
stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path

import structlog

from actors.guards.rss_trend import RssTrend

log = structlog.get_logger("tokenmill.memory")

INTERVAL_S = 1.0


def current_rss(statm: Path = Path("/proc/self/statm")) -> int | None:
    """This process's resident set in bytes (Linux), or None where it cannot be read."""
    try:
        resident_pages = int(statm.read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


class MemoryGuard:
    """Samples until `stop()`; `run()` may be called again after a stop.

    `on_over(reason)`: called once, on the event loop, with the first sample past `limit`.
    `on_sample(growth_bytes_per_s, limit)`: each sample, for metrics. `sample`: reads the RSS
    (default: `current_rss`).
    """

    def __init__(
        self,
        limit: int | None,
        on_over: Callable[[str], None],
        *,
        interval_s: float = INTERVAL_S,
        on_sample: Callable[[float, int | None], None] | None = None,
        sample: Callable[[], int | None] = current_rss,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = "memory_guard"  # as the supervisor names its children
        self.limit = limit
        self.on_over = on_over
        self.interval_s = interval_s
        self.on_sample = on_sample
        self.sample = sample
        self.clock = clock
        self.trend = RssTrend()
        self.over: str | None = None  # why, once past the limit
        self._stopping = asyncio.Event()

    def stop(self) -> None:
        self._stopping.set()

    async def run(self) -> None:
        try:
            while not self._stopping.is_set():
                if not self.check():
                    log.warning("rss_unreadable", limit=self.limit, detail="the guard is off")
                    return
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), self.interval_s)
        finally:
            self._stopping.clear()

    def check(self) -> bool:
        """One sample: exported, and past the limit handed to `on_over` (once). False when
        the RSS cannot be read."""
        rss = self.sample()
        if rss is None:
            return False
        self.trend.add(self.clock(), rss)
        growth = self.trend.growth_bytes_per_s
        if self.on_sample is not None:
            self.on_sample(growth, self.limit)
        if self.limit is not None and rss > self.limit and self.over is None:
            self.over = f"resident memory {rss} bytes is over --max-rss {self.limit}"
            log.warning(
                "memory_limit_reached",
                rss=rss,
                limit=self.limit,
                growth_bytes_per_s=round(growth),
            )
            self.on_over(self.over)
        return True
