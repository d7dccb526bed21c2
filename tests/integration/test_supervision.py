"""The supervisor on real worker subprocesses: a crashing GPU actor is restarted and its
requests answered; too many crashes drain the worker and exit non-zero, losing nothing;
/healthz, /readyz and /metrics answer over HTTP."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Callable

import pytest
from prometheus_client.parser import text_string_to_metric_families

from messages.error_codes import ErrorCode
from ops.services.local_process import free_port
from tests.integration.pipeline import (
    WorkerProcess,
    new_lane,
    produce,
    results_by_id,
    wait_committed_to_end,
)
from tests.integration.test_worker_failures import workload

pytestmark = pytest.mark.slow


def http_get(port: int, path: str) -> tuple[int, bytes]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


Readiness = Callable[[int, dict[str, object]], bool]


async def readiness(
    worker: WorkerProcess, port: int, wanted: Readiness, within_s: float
) -> dict[str, object]:
    """Poll /readyz until `wanted(status, details)`; its details."""
    async with asyncio.timeout(within_s):  # a hang bound only
        while True:
            assert worker.process is not None and worker.process.poll() is None, worker.log()
            try:
                status, body = await asyncio.to_thread(http_get, port, "/readyz")
            except OSError:
                status, body = 0, b"{}"
            details = json.loads(body) if body.startswith(b"{") else {}
            if wanted(status, details):
                return details
            await asyncio.sleep(0.2)


async def wait_ready(worker: WorkerProcess, port: int, within_s: float = 120) -> dict[str, object]:
    return await readiness(worker, port, lambda status, _: status == 200, within_s)


def samples(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    status, body = http_get(port, "/metrics")
    assert status == 200
    out = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


async def test_a_crashed_gpu_actor_is_restarted_and_its_requests_answered(
    kafka_bootstrap, tiny_checkpoints, tmp_path
) -> None:
    lane = await new_lane(kafka_bootstrap, partitions=2)
    requests = workload(40, max_new_tokens=12)
    ids = [r.id for r in requests]
    port = free_port()
    worker = WorkerProcess(
        lane,
        str(tiny_checkpoints["llama"]),
        tmp_path / "w.log",
        ["--http-port", str(port), "--max-num-seqs", "8"],
        env={"TOKENMILL_FAULTS": "gpu_crash_after_steps=6"},
    ).start()
    try:
        ready = await wait_ready(worker, port)
        assert ready["consuming"] and ready["model_loaded"] and not ready["draining"]
        assert http_get(port, "/healthz") == (200, b'{"status":"ok"}')
        await produce(lane.bootstrap, lane.requests, requests)
        found = await results_by_id(lane, ids, within_s=180)
        await wait_committed_to_end(lane)
        await wait_ready(worker, port, within_s=30)  # ready again after the restart
        metrics = samples(port)
    finally:
        code = worker.terminate()
    log = worker.log()
    assert "child_crashed" in log and "InjectedFault" in log and "child_restarted" in log
    assert set(found) == set(ids)
    assert all(len(results) == 1 for results in found.values()), "exactly one result each"
    assert all(r.error is None for results in found.values() for r in results)
    assert metrics[("tokenmill_child_restarts_total", (("child", "gpu"),))] == 1
    answered = sum(v for (name, labels), v in metrics.items() if name == "tokenmill_requests_total")
    assert answered == len(ids)
    lag = {labels: v for (name, labels), v in metrics.items() if name == "tokenmill_consumer_lag"}
    assert lag and set(lag.values()) == {0}, "every partition read to its end"
    assert code == 0, log[-3000:]


async def test_too_many_crashes_drain_and_exit_non_zero_losing_nothing(
    kafka_bootstrap, tiny_checkpoints, tmp_path
) -> None:
    lane = await new_lane(kafka_bootstrap, partitions=2)
    requests = workload(30, max_new_tokens=12)
    ids = [r.id for r in requests]
    await produce(lane.bootstrap, lane.requests, requests)
    model = str(tiny_checkpoints["llama"])
    crashing = WorkerProcess(
        lane,
        model,
        tmp_path / "crashing.log",
        ["--max-restarts", "1", "--shutdown-timeout", "5"],
        env={"TOKENMILL_FAULTS": "gpu_crash_after_steps=2,gpu_crashes=100"},
    ).start()
    try:
        code = await asyncio.to_thread(crashing.wait, 180)
    finally:
        crashing.close()
    assert code == 1, crashing.log()[-3000:]
    assert "worker_giving_up" in crashing.log()
    healthy = WorkerProcess(lane, model, tmp_path / "healthy.log").start()
    try:
        found = await results_by_id(lane, ids, within_s=180)
    finally:
        healthy.terminate()
    assert set(found) == set(ids), "what the crashing worker held is answered by another"
    # A request running through two crashes is answered engine_error (never retried forever).
    errors = {r.error.code for results in found.values() for r in results if r.error}
    assert errors <= {ErrorCode.ENGINE_ERROR, ErrorCode.SHUTTING_DOWN}
