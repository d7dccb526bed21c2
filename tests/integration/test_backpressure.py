"""A backlog far beyond the watermark: the worker pauses and resumes its partitions, its
memory stays flat while it works through the backlog, and every request is answered."""

from __future__ import annotations

import asyncio

import pytest

from messages.request import GenerateRequest
from tests.integration.pipeline import (
    WorkerProcess,
    new_lane,
    produce,
    results_by_id,
    rss_bytes,
    wait_committed_to_end,
)

pytestmark = pytest.mark.slow

BACKLOG = 5000
HIGH_WATERMARK = 32


async def test_backlog_is_worked_through_with_bounded_memory(
    kafka_bootstrap, tiny_checkpoints, tmp_path
) -> None:
    lane = await new_lane(kafka_bootstrap, partitions=3)
    requests = [
        GenerateRequest(id=f"b{i}", prompt_token_ids=[i % 300 + 3, 5, 7], max_new_tokens=2)
        for i in range(BACKLOG)
    ]
    ids = [r.id for r in requests]
    await produce(lane.bootstrap, lane.requests, requests)

    worker = WorkerProcess(
        lane,
        str(tiny_checkpoints["llama"]),
        tmp_path / "worker.log",
        ["--high-watermark-requests", str(HIGH_WATERMARK), "--max-batch-size", "16"],
    ).start()
    samples: list[int] = []

    async def sample_rss() -> None:
        while True:
            samples.append(rss_bytes(worker.pid))
            await asyncio.sleep(0.25)

    sampler = None
    try:
        await worker.wait_for_log("partitions_assigned")  # the model is loaded by now
        sampler = asyncio.create_task(sample_rss())
        found = await results_by_id(lane, ids, within_s=600)
        committed = await wait_committed_to_end(lane)
        log = worker.log()
    finally:
        if sampler is not None:
            sampler.cancel()
        assert worker.terminate() == 0

    assert set(found) == set(ids)
    assert all(r.error is None for rs in found.values() for r in rs)
    assert sum(committed.values()) == BACKLOG
    assert log.count("partitions_paused") >= 10, "backpressure engaged again and again"
    assert "partitions_resumed" in log
    # Memory: after the first tenth of the run, RSS grows by no more than a few MB while the
    # rest of the backlog (thousands of records) flows through.
    warm = samples[len(samples) // 10 :]
    growth = max(warm) - warm[0]
    assert growth < 64 << 20, f"RSS grew {growth >> 20} MiB over the backlog"
