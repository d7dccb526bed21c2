"""Workers as real subprocesses: killed, drained, rebalanced — and still nothing is lost.

At-least-once: every request gets a result; duplicates are allowed only for what was in
flight when a worker died.
"""

from __future__ import annotations

import asyncio

import pytest

from messages.error_codes import ErrorCode
from messages.request import GenerateRequest
from tests.integration.pipeline import (
    Lane,
    WorkerProcess,
    new_lane,
    produce,
    read_all,
    results_by_id,
    wait_committed_to_end,
)

pytestmark = pytest.mark.slow


def workload(n: int, max_new_tokens: int) -> list[GenerateRequest]:
    return [
        GenerateRequest(
            id=f"r{i}",
            prompt_token_ids=[(i * 7 + k) % 300 + 3 for k in range(4 + i % 29)],
            max_new_tokens=max_new_tokens,
        )
        for i in range(n)
    ]


async def count_results(lane: Lane, ids: list[str], at_least: int) -> None:
    """Wait until at least `at_least` of `ids` have a result."""
    while True:
        found = await results_by_id(lane, ids, within_s=1.0)
        if len(found) >= at_least:
            return
        await asyncio.sleep(0.5)


def worker(lane: Lane, model: str, tmp_path, name: str, *extra: str) -> WorkerProcess:
    return WorkerProcess(lane, model, tmp_path / f"{name}.log", list(extra)).start()


async def test_kill_9_midway_loses_nothing(kafka_bootstrap, tiny_checkpoints, tmp_path) -> None:
    lane = await new_lane(kafka_bootstrap, partitions=3)
    requests = workload(300, max_new_tokens=24)
    ids = [r.id for r in requests]
    # Half before the kill, half after it: however fast the first worker is, the second one
    # has work left (a quiet machine let the first finish all 300 before the kill).
    await produce(lane.bootstrap, lane.requests, requests[:150])
    model = str(tiny_checkpoints["llama"])

    first = worker(lane, model, tmp_path, "first", "--max-num-seqs", "8")
    try:
        await asyncio.wait_for(count_results(lane, ids, 40), 180)
        assert first.kill() == -9
    finally:
        first.close()
    await produce(lane.bootstrap, lane.requests, requests[150:])
    second = worker(lane, model, tmp_path, "second")
    try:
        found = await results_by_id(lane, ids, within_s=300)
        committed = await wait_committed_to_end(lane)
    finally:
        second.terminate()

    assert set(found) == set(ids), f"missing: {sorted(set(ids) - set(found))[:10]}"
    assert all(r.error is None for results in found.values() for r in results)
    assert sum(committed.values()) == len(ids)
    answered_by = {r.worker for results in found.values() for r in results}
    assert len(answered_by) == 2, "both workers answered part of the stream"


async def test_sigterm_drains_and_a_second_worker_finishes(
    kafka_bootstrap, tiny_checkpoints, tmp_path
) -> None:
    lane = await new_lane(kafka_bootstrap, partitions=3)
    requests = workload(300, max_new_tokens=32)
    ids = [r.id for r in requests]
    # Half before the drain, half after it, so the second worker has work left however fast
    # the first one is.
    await produce(lane.bootstrap, lane.requests, requests[:150])
    model = str(tiny_checkpoints["llama"])

    # A short drain window, so some requests are failed with `shutting_down`; a low
    # watermark, so the first worker holds only part of the backlog when it stops.
    first = worker(
        lane, model, tmp_path, "first", "--max-num-seqs", "8", "--shutdown-timeout", "0.5",
        "--high-watermark-requests", "16",
    )  # fmt: skip
    try:
        await asyncio.wait_for(count_results(lane, ids, 30), 180)
        assert first.terminate() == 0, first.log()[-3000:]
    finally:
        first.close()
    assert "worker_stopped" in first.log()

    await produce(lane.bootstrap, lane.requests, requests[150:])
    second = worker(lane, model, tmp_path, "second")
    try:
        await second.wait_for_log("ingest_started")
        found = await results_by_id(lane, ids, within_s=300)
        committed = await wait_committed_to_end(lane)
    finally:
        assert second.terminate() == 0
    assert "request_rejected" not in second.log()
    answered_by_second = sum(r.worker in second.log() for rs in found.values() for r in rs)
    assert answered_by_second > 0, "the second worker finished the rest"

    assert set(found) == set(ids), f"missing: {sorted(set(ids) - set(found))[:10]}"
    # Everything on the results topic, not just the first result per id: no duplicates.
    every = await read_all(lane.bootstrap, lane.results, until=len(ids) + 1, within_s=5)
    assert len(every) == len(ids), "a drain is not a crash: no duplicates"
    for results in found.values():
        error = results[0].error
        assert error is None or error.code == ErrorCode.SHUTTING_DOWN
    assert sum(committed.values()) == len(ids)


async def test_two_workers_share_partitions_and_survive_one_leaving(
    kafka_bootstrap, tiny_checkpoints, tmp_path
) -> None:
    lane = await new_lane(kafka_bootstrap, partitions=4)
    model = str(tiny_checkpoints["llama"])
    a = worker(lane, model, tmp_path, "a", "--max-num-seqs", "4")
    b = worker(lane, model, tmp_path, "b", "--max-num-seqs", "4")
    try:
        await a.wait_for_log("partitions_assigned")
        await b.wait_for_log("partitions_assigned")
        requests = workload(400, max_new_tokens=24)
        ids = [r.id for r in requests]
        await produce(lane.bootstrap, lane.requests, requests)
        await asyncio.wait_for(count_results(lane, ids, 60), 180)
        assert a.terminate() == 0, a.log()[-3000:]
        found = await results_by_id(lane, ids, within_s=300)
        committed = await wait_committed_to_end(lane)
    finally:
        a.close()
        assert b.terminate() == 0, b.log()[-3000:]
    assert "Traceback" not in a.log() + b.log()

    assert set(found) == set(ids), f"missing: {sorted(set(ids) - set(found))[:10]}"
    workers = {r.worker for results in found.values() for r in results}
    assert len(workers) == 2, "both workers consumed part of the topic"
    assert sum(committed.values()) == len(ids)
