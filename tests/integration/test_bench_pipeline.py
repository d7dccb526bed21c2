"""`tokenmill bench pipeline` on tiny workloads against the session broker: the report's shape
and counts, never its timings (this machine's speed is not under test)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from actors.kafka.connection import KafkaConnection
from gpu.engine_config import EngineConfig
from ops.bench.cli import bench
from ops.bench.pipeline import PipelineOptions, light_rate, run_bench
from ops.bench.workload import Workload
from ops.models.engine_options import EngineChoice

ENGINE = EngineConfig(max_model_len=128, max_num_seqs=8, num_kv_blocks=64)


@pytest.fixture(scope="module")
def tiny_llama(tiny_checkpoints: dict[str, Path]) -> EngineChoice:
    return EngineChoice(
        model=str(tiny_checkpoints["llama"]), dtype="float32", device="cpu", engine=ENGINE
    )


def _check_targets(report: dict[str, Any], measured: set[str]) -> None:
    assert set(report["targets"]) == {
        "throughput_ratio_vs_direct",
        "latency_added_p50_ms",
        "ceiling_requests_per_s",
        "ceiling_text_requests_per_s",
    }
    for name, target in report["targets"].items():
        assert {"target", "value", "met"} <= set(target)
        if name in measured:
            assert isinstance(target["value"], float | int)
            assert isinstance(target["met"], bool)
        else:
            assert (target["value"], target["met"]) == (None, None)


async def test_ceiling_through_an_echo_worker_from_the_cli(
    kafka_bootstrap: str, tiny_checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    args = f"pipeline --model {tiny_checkpoints['llama']} --max-model-len 128 --only ceiling "
    args += f"--bootstrap-servers {kafka_bootstrap} --partitions 2 --echo-requests 300 "
    args += f"--echo-prompt-tokens 8 --latency-requests 3 --rate 20 --json --out {tmp_path}"
    # The command runs its own event loop: off this test's loop, on a thread of its own.
    result = await asyncio.to_thread(CliRunner().invoke, bench, args.split())

    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    (written,) = await asyncio.to_thread(lambda: list(tmp_path.glob("*-pipeline-*.json")))
    assert report == json.loads(await asyncio.to_thread(written.read_text))
    assert report["benchmark"] == "pipeline" and report["sections"] == ["ceiling"]
    assert isinstance(report["warnings"], list)
    assert report["model"]["echo_digest"].startswith("echo:sha256:")
    assert report["worker"]["mode"].startswith("subprocess")
    assert report["worker"]["exit_code"] == {"echo": 0}
    assert report["throughput"] == report["latency"] == {"skipped": "not selected (--only)"}
    ceiling = report["ceiling"]
    light = ceiling["latency_at_light_rate"]
    assert (light["rate_per_s"], light["results"], light["errors"]) == (20.0, 3, 0)
    assert set(light["end_to_end_ms"]) == {"p50", "p90", "p99"}
    for kind in ("prompt_token_ids", "text_prompts"):
        run = ceiling[kind]
        assert (run["requests"], run["results"], run["errors"]) == (300, 300, 0)
        assert {"wall_s", "requests_per_s", "all_sent_and_acked_s"} <= set(run)
        assert set(run["cpu_s"]) == set(run["cores_busy"]) == {"worker", "client", "broker"}
    assert {"cpus", "cpu_count", "torch_threads"} <= set(report["host"])
    assert {"date", "commit"} <= set(report)
    _check_targets(report, {"ceiling_requests_per_s", "ceiling_text_requests_per_s"})


async def test_throughput_and_latency_against_the_direct_engine(
    kafka_bootstrap: str, tiny_llama: EngineChoice
) -> None:
    options = PipelineOptions(
        engine=tiny_llama,
        workload=Workload(requests=4, min_prompt=4, max_prompt=12, min_output=3, max_output=8),
        sections=("throughput", "latency"),
        kafka=KafkaConnection(kafka_bootstrap),
        partitions=2,
        throughput_rounds=2,
        rate=20.0,
        latency_requests=3,
        latency_max_new_tokens=4,
        timeout_s=120,
    )

    report = await run_bench(options)

    json.dumps(report)
    assert report["worker"]["exit_code"] == {"torch": 0}
    assert report["ceiling"] == {"skipped": "not selected (--only)"}
    throughput = report["throughput"]
    rounds = throughput["rounds"]
    assert [(r["round"], r["seed"], r["first"]) for r in rounds] == [
        (1, 0, "direct"),
        (2, 1, "kafka"),
    ]
    assert report["workload"]["throughput_round_seeds"] == [0, 1]
    assert (report["workload"]["warm_up"]["seed"], report["workload"]["latency_seed"]) == (2, 3)
    for r in rounds:
        direct, kafka = r["direct"], r["kafka"]
        assert direct["requests"] == kafka["requests"] == kafka["results"] == 4
        assert kafka["errors"] == 0
        assert 4 <= direct["output_tokens"] <= 4 * 8
        assert 0 <= kafka["outputs_matching_direct"] <= 4
        assert {"wall_s", "output_tokens_per_s", "cpu_s"} <= set(direct) & set(kafka)
        assert set(kafka["cpu_s"]) == {"worker", "client", "broker"}
        assert set(direct["cpu_s"]) == {"this_process", "worker", "broker"}
        assert "tokens" not in direct and "results_tokens" not in kafka
        assert r["ratio"] is not None
    assert throughput["interleaved"] is True  # a CPU engine: both held, taking turns
    assert throughput["ratios"] == [r["ratio"] for r in rounds]
    assert throughput["ratio"] == round(sum(throughput["ratios"]) / 2, 3)  # the median of two
    # The rounds pooled: tokens and wall seconds summed.
    direct, kafka = throughput["direct"], throughput["kafka"]
    assert (direct["requests"], kafka["results"]) == (8, 8)
    assert direct["output_tokens"] == sum(r["direct"]["output_tokens"] for r in rounds)
    assert kafka["outputs_matching_direct"] == sum(
        r["kafka"]["outputs_matching_direct"] for r in rounds
    )
    # The worker is started with the direct engine's pool size (ENGINE fixes it here; that it
    # is taken from the direct engine when none is given: tests/unit/ops/bench/test_pipeline.py).
    argv = report["worker"]["argv"]["torch"]
    assert argv[argv.index("--num-kv-blocks") + 1] == str(report["worker"]["kv_blocks"])
    latency = report["latency"]
    assert (latency["kafka"]["results"], latency["kafka"]["errors"]) == (3, 0)
    for figures in (latency["direct_ms"], latency["kafka"]["end_to_end_ms"]):
        assert set(figures) == {"p50", "p90", "p99"}
    assert set(latency["added_ms"]) == {"p50", "p99"}
    assert {"request_leg_ms", "result_leg_ms", "worker_total_ms"} <= set(latency["kafka"])
    assert (latency["rate_per_s"], latency["rate_chosen"]) == (20.0, "given")
    _check_targets(report, {"throughput_ratio_vs_direct", "latency_added_p50_ms"})


def test_the_default_latency_rate_keeps_requests_apart() -> None:
    assert light_rate([1000.0] * 10) == 0.5  # one request per two p90s
    assert light_rate([10.0] * 10) == 2.0  # a fast engine: capped
