"""The memory guard on real worker subprocesses: a worker that leaks on every engine step
(`TOKENMILL_FAULTS=leak_mb_per_step=N`) passes `--max-rss`, drains (the graceful drain) and
exits 0, a planned restart; the other worker of the group answers the rest. Nothing is lost
and, a drain not being a crash, nothing is answered twice."""

from __future__ import annotations

import asyncio

import pytest

from tests.integration.pipeline import (
    WorkerProcess,
    new_lane,
    produce,
    read_all,
    results_by_id,
    rss_bytes,
    wait_committed_to_end,
)
from tests.integration.test_watchdog import logged
from tests.integration.test_worker_failures import workload

pytestmark = pytest.mark.slow

HEADROOM = 150 << 20  # over a worker's resident set at rest: about 15 leaky steps


async def test_a_leaking_worker_drains_and_exits_zero_over_max_rss_losing_nothing(
    kafka_bootstrap, tiny_checkpoints, tmp_path
) -> None:
    lane = await new_lane(kafka_bootstrap, partitions=2)
    model = str(tiny_checkpoints["llama"])
    requests = workload(60, max_new_tokens=24)
    ids = [r.id for r in requests]
    healthy = WorkerProcess(lane, model, tmp_path / "healthy.log").start()
    leaky = None
    try:
        await healthy.wait_for_log("ingest_started")
        # The limit: a worker of this model at rest (the healthy one, same code), and room.
        limit = rss_bytes(healthy.pid) + HEADROOM
        leaky = WorkerProcess(
            lane, model, tmp_path / "leaky.log",
            ["--max-rss", str(limit), "--max-num-seqs", "4"],
            env={"TOKENMILL_FAULTS": "leak_mb_per_step=10"},
        ).start()  # fmt: skip
        await leaky.wait_for_log('"partitions": ["')  # the group split its partitions
        await produce(lane.bootstrap, lane.requests, requests)
        code = await asyncio.to_thread(leaky.wait, 180)  # a hang bound only
        found = await results_by_id(lane, ids, within_s=180)
        await wait_committed_to_end(lane)
    finally:
        if leaky is not None:
            leaky.close()
        assert healthy.terminate() == 0, healthy.log()[-3000:]

    assert leaky is not None
    assert code == 0, leaky.log()[-3000:]
    (reached,) = logged(leaky, "memory_limit_reached")
    assert reached["limit"] == limit and isinstance(reached["rss"], int) and reached["rss"] > limit
    (draining,) = logged(leaky, "worker_draining")
    assert "over --max-rss" in str(draining["reason"])
    (stopped,) = logged(leaky, "worker_stopped")
    assert stopped["exit_code"] == 0 and stopped["results"] > 0, "it answered part of the load"

    assert set(found) == set(ids), f"missing: {sorted(set(ids) - set(found))[:10]}"
    assert all(r.error is None for results in found.values() for r in results)
    every = await read_all(lane.bootstrap, lane.results, until=len(ids) + 1, within_s=5)
    assert len(every) == len(ids), "a drain is not a crash: each request answered once"
