"""The progress watchdog on real worker subprocesses: an engine step that never returns
(`TOKENMILL_FAULTS=hang_step_after=N`) makes the worker not live (`/healthz` 503 with the
reason), leave its group without waiting for the engine, and exit 1; the other worker of the
group then answers every request, the hung one's included (nothing it held was committed)."""

from __future__ import annotations

import asyncio
import json

import pytest

from ops.services.local_process import free_port
from tests.integration.pipeline import WorkerProcess, new_lane, produce, results_by_id
from tests.integration.test_supervision import http_get, wait_ready
from tests.integration.test_worker_failures import workload

pytestmark = pytest.mark.slow


async def first_not_live(worker: WorkerProcess, port: int) -> tuple[int, bytes] | None:
    """Probe /healthz until it answers anything but 200 (that answer), or the process is gone
    (None)."""
    assert worker.process is not None
    while worker.process.poll() is None:
        try:
            status, body = await asyncio.to_thread(http_get, port, "/healthz")
        except OSError:  # the server closed: the process is on its way out
            await asyncio.sleep(0.01)
            continue
        if status != 200:
            return status, body
    return None


def logged(worker: WorkerProcess, event: str) -> list[dict[str, object]]:
    lines = (json.loads(line) for line in worker.log().splitlines() if line.startswith("{"))
    return [line for line in lines if line.get("event") == event]


async def test_a_hung_engine_is_not_live_leaves_and_exits_and_the_group_answers_all(
    kafka_bootstrap, tiny_checkpoints, tmp_path
) -> None:
    lane = await new_lane(kafka_bootstrap, partitions=2)
    model = str(tiny_checkpoints["llama"])
    requests = workload(40, max_new_tokens=8)
    ids = [r.id for r in requests]
    port = free_port()
    # Its fourth step hangs: no request of its partition can finish (each needs 8). Leaving
    # takes milliseconds; `stall_linger_s` keeps it not live a while first, for the probe.
    hung = WorkerProcess(
        lane, model, tmp_path / "hung.log",
        ["--http-port", str(port), "--watchdog-floor-s", "2", "--max-num-seqs", "4"],
        env={"TOKENMILL_FAULTS": "hang_step_after=3,stall_linger_s=3"},
    ).start()  # fmt: skip
    healthy = None
    try:
        await wait_ready(hung, port)
        healthy = WorkerProcess(lane, model, tmp_path / "healthy.log").start()
        # Its first assignment is the group split in two: each worker holds a partition.
        await healthy.wait_for_log('"partitions": ["')
        await produce(lane.bootstrap, lane.requests, requests)
        not_live = await first_not_live(hung, port)
        code = await asyncio.to_thread(hung.wait, 120)  # a hang bound only
        found = await results_by_id(lane, ids, within_s=180)
    finally:
        hung.close()
        if healthy is not None:
            assert healthy.terminate() == 0, healthy.log()[-3000:]

    assert not_live is not None, f"/healthz never said 503:\n{hung.log()[-3000:]}"
    status, body = not_live
    assert status == 503
    (stalled,) = logged(hung, "engine_stalled")
    assert json.loads(body) == {"status": "stalled", "reason": stalled["reason"]}
    bound = stalled["bound_s"]
    assert isinstance(bound, float) and bound >= 2.0, "the floor, or 10× its slowest step"
    assert f"over its bound of {bound:.1f} s" in str(stalled["reason"])
    assert stalled["steps"] == 3
    assert code == 1, hung.log()[-3000:]
    assert "engine hung" in logged(hung, "worker_giving_up")[0]["reason"]
    assert logged(hung, "worker_stopped"), "it left cleanly: no wait for the hung step"

    assert set(found) == set(ids), f"missing: {sorted(set(ids) - set(found))[:10]}"
    assert all(r.error is None for results in found.values() for r in results)
    answered_by = {r.worker for results in found.values() for r in results}
    assert healthy is not None and all(w in healthy.log() for w in answered_by)
