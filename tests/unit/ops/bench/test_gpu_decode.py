"""The decode roofline on CPU (perf_counter, host memcpy): fields present and consistent.

No timing is asserted: only that each figure exists, is positive and agrees with the others.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from gpu.engine import Engine
from gpu.engine_config import EngineConfig
from gpu.loading.random_weights import load_random_model
from ops.bench.cli import bench
from ops.bench.gpu_decode import (
    DecodeOptions,
    kv_bytes_attended,
    read_weight_bytes,
    run_decode_roofline,
)
from tests.tiny_models import tiny_config

CONFIGS = Path(__file__).resolve().parents[3] / "gpu" / "configs"
OPTIONS = DecodeOptions(prompt_tokens=6, new_tokens=4, batches=(2, 3), copy_bytes=1 << 20)


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_config(CONFIGS / "llama3-8b.json", tmp_path_factory.mktemp("c") / "config.json")


@pytest.fixture(scope="module")
def section(config: Path) -> dict[str, Any]:
    engine = Engine(
        load_random_model(config, device="cpu"),
        EngineConfig(max_num_seqs=2, num_kv_blocks=16, max_model_len=64),
    )
    result = run_decode_roofline(engine, OPTIONS)
    json.dumps(result)
    return result


def test_batch1_against_the_roofline(section: dict[str, Any]) -> None:
    assert section["timer"] == "perf_counter" and section["device"] == "cpu"
    bw = section["bandwidth"]
    assert bw["bytes_copied"] == 1 << 20 and bw["bytes_per_s"] > 0
    assert bw["best_s"] <= bw["median_s"]
    one = section["batch1"]
    assert one["batch"] == 1 and one["steady_steps"] == OPTIONS.new_tokens - 1  # after prefill
    assert one["steps"] == OPTIONS.new_tokens
    assert one["step_ms"] > 0 and one["tokens_per_s"] > 0
    assert one["tokens_per_s"] == pytest.approx(1e3 / one["step_ms"])
    w = one["weight_bytes"]
    assert w["read_per_step"] == w["held"] - w["embedding_tables_not_read"] > 0
    assert w["embedding_tables_not_read"] == 300 * 64 * 4  # untied: one row a step is read
    assert one["bytes_per_step"] == pytest.approx(
        w["read_per_step"] + one["kv_bytes_attended_mean"]
    )
    roofline_s = one["bytes_per_step"] / bw["bytes_per_s"]
    assert one["roofline_step_ms"] == pytest.approx(roofline_s * 1e3)
    assert one["roofline_fraction"] == pytest.approx(one["roofline_step_ms"] / one["step_ms"])
    assert one["step_over_roofline"] == pytest.approx(1 / one["roofline_fraction"])


def test_batches_decode_together_or_say_why_not(section: dict[str, Any]) -> None:
    two = section["batches"]["2"]
    assert two["batch"] == 2 and two["steady_steps"] == OPTIONS.new_tokens - 1
    assert two["tokens_per_s"] == pytest.approx(2 * two["steady_steps"] / two["steady_s"])
    assert "max_num_seqs 2" in section["batches"]["3"]["skipped"]


def test_kv_bytes_attended_count_every_layer(config: Path) -> None:
    engine = Engine(
        load_random_model(config, device="cpu"),
        EngineConfig(max_num_seqs=1, num_kv_blocks=4, max_model_len=64),
    )
    # 2 layers × K and V × 2 kv heads × head_dim 16 × 4 bytes, per position
    assert kv_bytes_attended(engine, 10) == 10 * 2 * 2 * 2 * 16 * 4
    assert read_weight_bytes(engine.model.module)["held"] > 0


def test_bench_engine_with_random_weights_and_the_roofline(config: Path) -> None:
    args = (
        f"engine --random-weights {config} --device cpu --max-model-len 64 --max-num-seqs 2 "
        "--num-kv-blocks 16 --requests 2 --min-prompt 4 --max-prompt 6 --min-output 2 "
        "--max-output 3 --gemm-size 32 --decode-roofline --roofline-prompt-tokens 6 "
        "--roofline-new-tokens 3"
    )
    result = CliRunner().invoke(bench, [*args.split(), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["model"]["name"] == "config (random weights)"
    assert "random weights" in report["contenders"]["transformers_static"]["skipped"]
    assert report["decode_roofline"]["batch1"]["roofline_fraction"] > 0
    assert set(report["decode_roofline"]["batches"]) == {"16", "64"}  # skipped: max_num_seqs 2
    text = CliRunner().invoke(bench, args.split())
    assert text.exit_code == 0, text.output
    assert "decode roofline" in text.stdout and "of the bandwidth bound" in text.stdout


def test_bench_engine_needs_a_model_or_random_weights() -> None:
    result = CliRunner().invoke(bench, ["engine", "--device", "cpu"])
    assert result.exit_code == 2 and "--random-weights" in result.output


def test_bench_engine_names_an_unsupported_architecture(tmp_path: Path) -> None:
    config = tiny_config(CONFIGS / "llama3-8b.json", tmp_path / "c.json", model_type="mamba")
    result = CliRunner().invoke(bench, ["engine", "--random-weights", str(config)])
    assert result.exit_code == 1 and "model_type 'mamba' is not supported" in result.output
