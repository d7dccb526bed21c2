"""Jaeger stopped in the middle of a run: the worker keeps answering every request, its
spans up to the outage are in Jaeger, and it shuts down cleanly. (How long requests took
before and after is printed, not asserted: timings on a shared machine are noise.)"""

from __future__ import annotations

import asyncio
import statistics
from pathlib import Path

from messages.request import GenerateRequest
from ops.services.jaeger import LocalJaeger
from ops.trace.query import traces_of_request
from tests.e2e.waiting import wait_for
from tests.integration.pipeline import (
    WorkerProcess,
    new_lane,
    produce,
    results_by_id,
)


def requests(prefix: str, n: int) -> list[GenerateRequest]:
    return [
        GenerateRequest(id=f"{prefix}-{i}", prompt_token_ids=[4, 5, 6], max_new_tokens=4)
        for i in range(n)
    ]


async def test_stopping_jaeger_mid_run_loses_no_request(
    kafka_bootstrap: str, tiny_checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    jaeger = LocalJaeger(
        state_dir=tmp_path / "jaeger", ui_port=0, otlp_grpc_port=0, otlp_http_port=0
    )
    await asyncio.to_thread(jaeger.start, 120)
    lane = await new_lane(kafka_bootstrap, partitions=2)
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": jaeger.otlp_http, "OTEL_BSP_SCHEDULE_DELAY": "100"}
    worker = WorkerProcess(
        lane, str(tiny_checkpoints["llama"]), tmp_path / "worker.log", env=env
    ).start()
    try:
        await worker.wait_for_log("ingest_started")
        before = requests("before", 30)
        await produce(lane.bootstrap, lane.requests, before)
        first = await results_by_id(lane, [r.id for r in before], within_s=120)
        # Exported every 100 ms; on a busy machine later: wait until it shows in Jaeger.
        traced = await wait_for(lambda: traces_of_request(jaeger.ui_url, "before-0"), 120)
        await asyncio.to_thread(jaeger.stop)
        after = requests("after", 60)
        for chunk in (after[:30], after[30:]):
            await produce(lane.bootstrap, lane.requests, chunk)
            await asyncio.sleep(1)  # exports fail meanwhile
        found = await results_by_id(lane, [r.id for r in after], within_s=120)
        code = worker.terminate()
    finally:
        worker.close()
        await asyncio.to_thread(jaeger.stop)
    assert set(first) == {r.id for r in before}
    assert set(found) == {r.id for r in before + after}, "requests keep being answered"
    assert all(len(v) == 1 and v[0].error is None for v in found.values())
    assert traced, "spans reached Jaeger while it was up"
    assert code == 0 and "Traceback" not in worker.log()
    took = {k: v[0].timings.total_ms for k, v in found.items() if v[0].timings}
    print(
        "median total_ms with Jaeger up "
        f"{statistics.median(t for k, t in took.items() if k.startswith('before')):.1f}, "
        f"down {statistics.median(t for k, t in took.items() if k.startswith('after')):.1f}"
    )
