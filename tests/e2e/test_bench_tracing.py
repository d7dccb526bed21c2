"""`tokenmill bench pipeline --only tracing` on a tiny workload: echo workers with tracing
off and on, the traced ones exporting to a Jaeger started for the run. The report's shape and
counts only, never its timings."""

from __future__ import annotations

import json
from pathlib import Path

from actors.kafka.connection import KafkaConnection
from gpu.engine_config import EngineConfig
from ops.bench.pipeline import PipelineOptions, run_bench
from ops.models.engine_options import EngineChoice
from ops.services.jaeger import LocalJaeger


async def test_tracing_off_and_on_in_one_run(
    kafka_bootstrap: str, tiny_checkpoints: dict[str, Path], jaeger: LocalJaeger
) -> None:
    """(`jaeger`: the session's, which makes sure the binary is built.)"""
    engine = EngineChoice(
        model=str(tiny_checkpoints["llama"]),
        dtype="float32",
        device="cpu",
        engine=EngineConfig(max_model_len=128, max_num_seqs=8, num_kv_blocks=64),
    )
    options = PipelineOptions(
        engine=engine,
        sections=("tracing",),
        kafka=KafkaConnection(kafka_bootstrap),
        partitions=2,
        echo_prompt_tokens=8,
        tracing_requests=100,
        tracing_model_requests=2,
        tracing_rounds=1,
        timeout_s=120,
    )

    report = await run_bench(options)

    json.dumps(report)
    tracing = report["tracing"]
    assert "skipped" not in tracing, tracing
    assert report["ceiling"] == {"skipped": "not selected (--only)"}
    for workload, n in ((tracing, 100), (tracing["model"], 2)):
        rounds = workload["rounds"]
        assert rounds == 1
        for mode in ("off", "on"):
            runs = [(r["results"], r["errors"]) for r in workload[mode]]
            assert runs == [(n, 0)] * rounds, workload
        assert isinstance(workload["ratio_on_vs_off"], float)
        assert isinstance(workload["met"], bool)
        assert workload["tracing_cpu_us_per_request_elsewhere"]["span_export"] is not None
