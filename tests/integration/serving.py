"""A fresh worker answering waves of requests, each exactly once: what the tests that compare
two workers' answers (one with a feature, one without) share."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

from messages.request import GenerateRequest
from messages.result import GenerateResult
from ops.services.local_process import free_port
from tests.integration.pipeline import WorkerProcess, new_lane, produce, results_by_id
from tests.integration.test_supervision import samples, wait_ready


async def serve_waves(
    kafka_bootstrap: str,
    model: Path,
    log: Path,
    waves: Sequence[Sequence[GenerateRequest]],
    args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    metrics: str = "tokenmill_",
) -> tuple[dict[str, GenerateResult], dict[str, float]]:
    """Start a worker on a lane of its own (`args` after its HTTP port and a 512-token context),
    produce each wave once the ones before it are answered, and stop it. Returns its results by
    id (each answered exactly once, without error) and its /metrics samples whose names start
    with `metrics`, summed over labels."""
    lane = await new_lane(kafka_bootstrap, partitions=1)
    port = free_port()
    argv = ["--http-port", str(port), "--max-model-len", "512", *args]
    worker = WorkerProcess(lane, str(model), log, argv, env or {}).start()
    ids: list[str] = []
    try:
        await wait_ready(worker, port, within_s=300)
        for wave in waves:
            await produce(lane.bootstrap, lane.requests, list(wave))
            ids += [r.id for r in wave]
            found = await results_by_id(lane, ids, within_s=300)
        scraped: dict[str, float] = {}
        for (name, _), value in (await asyncio.to_thread(samples, port)).items():
            if name.startswith(metrics):
                scraped[name] = scraped.get(name, 0.0) + value
    finally:
        code = worker.terminate()
    assert code == 0, worker.log()[-3000:]
    answers = {}
    for rid, results in found.items():
        (result,) = results  # answered exactly once
        assert result.error is None, result.error
        answers[rid] = result
    return answers, scraped
