"""The memory guard exports each sample's growth and calls `on_over` once, with the first
sample past the limit; no limit, it only measures; no readable RSS, it stops."""

from __future__ import annotations

import asyncio
from pathlib import Path

from structlog.testing import capture_logs

from actors.guards.memory_guard import MemoryGuard, current_rss

MB = 1 << 20


class Samples:
    """RSS values in turn, one per sample, a second apart on the guard's clock."""

    def __init__(self, *values: int | None) -> None:
        self.values = list(values)
        self.now = 0.0

    def rss(self) -> int | None:
        self.now += 1.0
        return self.values.pop(0)

    def clock(self) -> float:
        return self.now


def guard(samples: Samples, limit: int | None) -> tuple[MemoryGuard, list[str], list[tuple]]:
    overs: list[str] = []
    exported: list[tuple[float, int | None]] = []
    made = MemoryGuard(
        limit,
        overs.append,
        on_sample=lambda *s: exported.append(s),
        sample=samples.rss,
        clock=samples.clock,
    )
    return made, overs, exported


def test_past_the_limit_on_over_is_called_once() -> None:
    samples = Samples(500 * MB, 510 * MB, 520 * MB, 530 * MB)
    made, overs, exported = guard(samples, limit=515 * MB)
    with capture_logs() as logs:
        for _ in range(4):
            assert made.check()
    assert overs == [f"resident memory {520 * MB} bytes is over --max-rss {515 * MB}"]
    assert [g for g, _ in exported] == [0.0, 10 * MB, 10 * MB, 10 * MB]
    assert {limit for _, limit in exported} == {515 * MB}
    (event,) = [e for e in logs if e["event"] == "memory_limit_reached"]
    assert (event["rss"], event["limit"], event["growth_bytes_per_s"]) == (
        520 * MB,
        515 * MB,
        10 * MB,
    )


def test_without_a_limit_it_only_measures() -> None:
    samples = Samples(500 * MB, 9000 * MB)
    made, overs, exported = guard(samples, limit=None)
    assert made.check() and made.check()
    assert overs == [] and exported[-1] == (8500 * MB, None)


async def test_an_unreadable_rss_stops_the_guard_with_one_warning() -> None:
    made, overs, _ = guard(Samples(None), limit=100 * MB)
    with capture_logs() as logs:
        await asyncio.wait_for(made.run(), 5.0)  # a hang bound only
    assert overs == [] and [e["event"] for e in logs] == ["rss_unreadable"]


def test_current_rss_reads_this_process_and_none_where_it_cannot(tmp_path: Path) -> None:
    rss = current_rss()
    assert rss is None or rss > MB
    assert current_rss(tmp_path / "absent") is None
    (tmp_path / "statm").write_text("garbage")
    assert current_rss(tmp_path / "statm") is None
