"""`tokenmill bench json` on a tiny random-weight Llama: report shape, token counts, no timing."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from gpu.engine import Engine
from gpu.engine_config import EngineConfig
from gpu.loading.loader import load_model
from ops.bench.cli import bench
from ops.bench.structured import JsonBenchOptions, run_json_bench


def test_both_runs_generate_every_token_at_each_batch(tiny_checkpoints: dict[str, Path]) -> None:
    engine = Engine(load_model(tiny_checkpoints["llama"]), EngineConfig(num_kv_blocks=64))
    options = JsonBenchOptions(batch_sizes=(1, 3), prompt_tokens=5, new_tokens=6)
    report = run_json_bench(engine, options)
    json.dumps(report)
    assert set(report["batches"]) == {"1", "3"}
    for batch, row in report["batches"].items():
        for run in (row["free"], row["constrained"]):
            assert run["output_tokens"] == int(batch) * 6
            assert run["finish_reasons"] == ["length"]
        assert row["throughput_ratio"] > 0


def test_the_cli_prints_json(tiny_checkpoints: dict[str, Path]) -> None:
    args = ["json", "--model", str(tiny_checkpoints["llama"]), "--batch-sizes", "2",
            "--prompt-tokens", "4", "--new-tokens", "3", "--num-kv-blocks", "32",
            "--json"]  # fmt: skip
    out = CliRunner().invoke(bench, args)
    assert out.exit_code == 0, out.output
    report = json.loads(out.stdout)
    assert report["batches"]["2"]["constrained"]["output_tokens"] == 6


def test_bad_batch_sizes_are_a_usage_error(tiny_checkpoints: dict[str, Path]) -> None:
    out = CliRunner().invoke(
        bench, ["json", "-m", str(tiny_checkpoints["llama"]), "--batch-sizes", "x"]
    )
    assert out.exit_code == 2 and "--batch-sizes" in out.output
