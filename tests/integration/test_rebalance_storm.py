"""A rebalance storm without transactions: workers started and stopped (SIGTERM) every few
seconds while requests flow. Each revocation is a clean hand-off (what is in flight on the
partitions given up is answered, then committed, then let go), and each stop a drain, so
nothing is lost and nothing is answered twice, even at-least-once.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from messages.result import GenerateResult
from tests.integration.pipeline import (
    WorkerProcess,
    every_result,
    new_lane,
    wait_committed_to_end,
)
from tests.integration.test_exactly_once import request, send_steadily, worker

pytestmark = pytest.mark.slow

STORM_S = 120.0  # how long workers come and go
EVERY_S = 5.0  # a start or a stop this often
ARGS = ["--session-timeout-ms", "10000", "--shutdown-timeout", "30"]


async def test_a_rebalance_storm_loses_nothing_and_answers_nothing_twice(
    kafka_bootstrap: str, smollm2_path: Path, tmp_path: Path
) -> None:
    lane = await new_lane(kafka_bootstrap, partitions=6)
    steady = worker(lane, tmp_path / "steady.log", "steady", *ARGS)
    extras: list[WorkerProcess] = []
    stopped: list[tuple[WorkerProcess, int]] = []
    n = int(STORM_S / 0.02)
    wanted = [request("s", i) for i in range(n)]
    try:
        await steady.wait_for_log("partitions_assigned", within_s=180)
        sending = asyncio.create_task(send_steadily(lane, wanted, every_s=0.02))
        started = time.monotonic()
        k = 0
        while time.monotonic() - started < STORM_S:
            # Up to three extra workers: start one, and once three run, stop the oldest.
            if len(extras) < 3 and k % 2 == 0:
                extras.append(worker(lane, tmp_path / f"w{k}.log", f"w{k}", *ARGS))
            elif extras:
                oldest = extras.pop(0)
                stopped.append((oldest, await asyncio.to_thread(oldest.terminate)))
            k += 1
            await asyncio.sleep(EVERY_S)  # the storm's pace, not a wait for an event
        await sending
        ids = {r.id for r in wanted}
        found: dict[str, list[GenerateResult]] = {}

        async def all_answered() -> bool:
            found.update(await every_result(lane))
            return ids <= found.keys()

        deadline = time.monotonic() + 240
        while not await all_answered():
            assert time.monotonic() < deadline, f"lost: {sorted(ids - found.keys())[:10]}"
            await asyncio.sleep(1)
        await wait_committed_to_end(lane, within_s=120)
    finally:
        codes = [p.terminate() for p in [steady, *extras]]
    found = await every_result(lane)
    logs = "".join(p.log()[-1500:] for p, code in stopped if code != 0)
    assert codes == [0] * len(codes) and all(code == 0 for _, code in stopped), logs
    missing = {r.id for r in wanted} - found.keys()
    duplicates = {i: [r.worker for r in rs] for i, rs in found.items() if len(rs) > 1}
    print(f"\nstorm: {len(wanted)} requests, {k} starts and stops: {len(missing)} lost, "
          f"{len(duplicates)} answered twice")  # fmt: skip
    assert not missing, f"lost: {sorted(missing)[:10]}"
    assert duplicates == {}, f"{len(duplicates)} duplicates: {list(duplicates.items())[:5]}"
