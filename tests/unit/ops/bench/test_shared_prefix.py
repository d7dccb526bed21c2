"""`bench engine --workload shared-prefix` on a tiny random-weight Llama: the report's shape,
its token counts and the outputs' agreement; no timing is asserted."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from gpu.engine import Engine
from gpu.engine_config import EngineConfig
from gpu.loading.loader import load_model
from ops.bench.cli import bench
from ops.bench.shared_prefix import OUTPUT_TOKENS, run_shared_prefix, shared_prefix_workload


def test_every_request_shares_the_prefix_and_the_run_with_caching_computes_it_once(
    tiny_checkpoints: dict[str, Path],
) -> None:
    engine = Engine(load_model(tiny_checkpoints["llama"]), EngineConfig(block_size=4))
    requests = shared_prefix_workload(engine, requests=6, seed=2, prefix_tokens=40)
    assert len({tuple(r.prompt_token_ids[:40]) for r in requests}) == 1
    assert len({tuple(r.prompt_token_ids) for r in requests}) == 6
    report = run_shared_prefix(engine, 6, 2, prefix_tokens=40, repeats=2)
    json.dumps(report)
    on, off = report["caching_on"], report["caching_off"]
    assert report["outputs_identical"] is True
    assert on["output_tokens"] == off["output_tokens"] == 6 * OUTPUT_TOKENS
    assert on["cached_prompt_tokens"] == 5 * 40 and off["cached_prompt_tokens"] == 0
    assert on["prefill_tokens_computed"] == off["prefill_tokens_computed"] - 5 * 40
    assert len(report["runs"]["caching_on"]) == len(report["runs"]["caching_off"]) == 2
    assert set(report["targets"]) == {"ttft_p50_off_over_on", "throughput_on_over_off"}


def test_the_cli_prints_the_summary(tiny_checkpoints: dict[str, Path]) -> None:
    args = "--device cpu --num-kv-blocks 256 --requests 3 --workload shared-prefix "
    args += "--prefix-tokens 32"
    result = CliRunner().invoke(
        bench, ["engine", "--model", str(tiny_checkpoints["llama"]), *args.split()]
    )
    assert result.exit_code == 0, result.output
    assert "caching on" in result.stdout and "ttft_p50_off_over_on" in result.stdout
    assert "outputs identical  True" in result.stdout
