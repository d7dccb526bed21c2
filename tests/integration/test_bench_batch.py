"""`tokenmill bench batch` on a small file against the session broker: the report's shape and
counts, never its timings (this machine's speed is not under test)."""

from __future__ import annotations

from pathlib import Path

from actors.kafka.connection import KafkaConnection
from gpu.engine_config import EngineConfig
from ops.bench.batch import BatchBenchOptions, run_batch_bench
from ops.models.engine_options import EngineChoice


async def test_the_report_compares_the_batch_client_and_the_gateway_with_a_raw_client(
    kafka_bootstrap: str, smollm2_path: Path
) -> None:
    options = BatchBenchOptions(
        engine=EngineChoice(model="smollm2-135m", dtype=None, device=None, engine=EngineConfig()),
        lines=200,
        max_inflight=64,
        kafka=KafkaConnection(kafka_bootstrap),
        partitions=2,
        timeout_s=300,
        gateway=True,
    )
    said: list[str] = []
    report = await run_batch_bench(options, said.append)

    assert report["worker_exit_code"] == 0
    assert report["baseline"]["results"] == 200 and report["baseline"]["errors"] == 0
    assert set(report["batch"]) == {"20", "200"}
    for lines, run in report["batch"].items():
        assert run["complete"] and run["ok"] == int(lines)
        assert run["peak_rss_mb"] > 0
    results = report["results"]
    assert results["batch_vs_raw_client"] > 0
    assert set(results["peak_rss_mb"]) == {"small", "large"}
    assert any("tokenmill batch run" in line for line in said)
    for lines, run in report["gateway"].items():  # the same files as /v1/batches batches
        assert run["complete"] and run["ok"] == int(lines)
    assert results["gateway_vs_batch_run"] > 0
    assert set(results["gateway_peak_rss_mb"]) == {"small", "large"}
