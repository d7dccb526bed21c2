"""The engine benchmark on a tiny random-weight Llama: report shape and token counts, no timing."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from gpu.engine import Engine
from gpu.engine_config import EngineConfig
from gpu.loading.loader import load_model
from ops.bench.cli import bench
from ops.bench.engine import EngineBenchOptions, measure_prefill, run_bench
from ops.bench.flops import FlopModel
from ops.bench.runs import measure
from ops.bench.workload import BenchRequest, Workload, engine_requests

WORKLOAD = Workload(requests=6, seed=3, min_prompt=4, max_prompt=12, min_output=3, max_output=9)
OPTIONS = EngineBenchOptions(
    workload=WORKLOAD,
    sequential_requests=3,
    static_batch=4,
    static_batches=2,
    gemm_size=128,
    profile_decode_steps=2,
)


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoints: dict[str, Path]) -> Path:
    return tiny_checkpoints["llama"]


def _engine(checkpoint: Path) -> Engine:
    return Engine(
        load_model(checkpoint, device="cpu"), EngineConfig(max_num_seqs=4, num_kv_blocks=64)
    )


@pytest.fixture(scope="module")
def report(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    options = replace(OPTIONS, profile_dir=tmp_path_factory.mktemp("prof"))
    result = run_bench(_engine(checkpoint), options)
    json.dumps(result)  # JSON-ready
    return result


def test_workload_is_seeded_and_avoids_special_tokens(checkpoint: Path) -> None:
    engine = _engine(checkpoint)
    first, again = WORKLOAD.build(engine), WORKLOAD.build(engine)
    assert first == again
    assert len(first) == WORKLOAD.requests
    eos = set(engine.model.eos_token_ids)
    for r in first:
        assert WORKLOAD.min_prompt <= len(r.prompt_token_ids) <= WORKLOAD.max_prompt
        assert WORKLOAD.min_output <= r.max_new_tokens <= WORKLOAD.max_output
        assert not eos & set(r.prompt_token_ids)


def test_every_contender_generates_exactly_the_asked_tokens(report: dict[str, Any]) -> None:
    c = report["contenders"]
    assert set(c) == {"engine", "transformers_sequential", "transformers_static"}
    for stats in c.values():
        assert stats["output_tokens"] == stats["expected_output_tokens"] > 0
        assert stats["output_tokens_per_s"] > 0
        assert stats["wall_s"] > 0
    assert c["engine"]["requests"] == WORKLOAD.requests
    assert c["engine"]["output_tokens"] == report["workload"]["output_tokens"]
    assert c["transformers_sequential"]["requests"] == OPTIONS.sequential_requests
    assert c["transformers_sequential"]["batch_size"] == 1
    static = c["transformers_static"]
    assert static["requests"] == 6 and static["batches"] == 2  # 4 + a partial batch of 2
    assert static["generated_tokens_incl_padding"] >= static["output_tokens"]
    assert 0 <= static["padding_waste_fraction"] < 1


def test_engine_matches_transformers_greedy(report: dict[str, Any]) -> None:
    # Same fp32 checkpoint, greedy: the engine must agree with transformers token for token
    # (up to an EOS, which transformers masks under min_new_tokens and the engine keeps).
    c = report["contenders"]
    assert c["transformers_sequential"]["outputs_differing_from_engine"] == []
    assert c["transformers_sequential"]["outputs_matching_engine"] == OPTIONS.sequential_requests
    assert c["transformers_static"]["outputs_matching_engine"] == 6


def test_report_shape(report: dict[str, Any]) -> None:
    assert set(report["ratios"]) == {"engine_vs_sequential", "engine_vs_static"}
    assert all(v > 0 for v in report["ratios"].values())
    for key in ("ttft_ms", "tpot_ms"):
        latency = report["contenders"]["engine"][key]
        assert set(latency) == {"p50", "p90", "p99"}
        assert all(v is not None for v in latency.values())
    model = report["model"]
    assert 0 < report["contenders"]["engine"]["peak_kv_blocks"] <= model["kv_blocks"] == 64
    assert model["block_size"] == 16
    f = report["flops"]
    for key in ("gemm_peak_gflops", "engine_gflops"):
        assert f[key] > 0
    assert f["steady_decode"]["steps"] > 0 and f["steady_decode"]["gflops"] > 0
    assert f["steady_decode_fraction"] is not None
    assert "lm_head" in f["formula"]
    prefill = report["prefill"]  # the prompts alone, one new token each
    assert prefill["requests"] == report["workload"]["requests"]
    assert prefill["prompt_tokens"] == report["workload"]["prompt_tokens"]
    assert prefill["prompt_tokens_per_s"] > 0 and prefill["fraction_of_gemm_peak"] > 0
    assert prefill["cached_prompt_tokens"] == 0  # computed, not found in the prefix cache
    for target in report["targets"].values():
        assert set(target) == {"target", "at_least", "value", "met"}
        assert isinstance(target["met"], bool)
    assert model["device"] == "cpu" and model["dtype"] == "float32"
    assert report["environment"]["transformers"]
    # Every report says when, where and on what code it was made.
    assert report["date"].startswith("20") and report["host"]["cpus"] >= 1
    assert "commit" in report and report["benchmark"] == "engine"


def test_profile_writes_chrome_traces(report: dict[str, Any]) -> None:
    for phase in ("prefill", "decode"):
        p = report["profile"][phase]
        trace = json.loads(Path(p["trace"]).read_text())
        assert trace["traceEvents"]
        assert p["steps"] > 0 and p["top_ops"]


def test_flop_model_counts_the_workload() -> None:
    from gpu.model_config import ModelConfig

    config = ModelConfig(
        arch="llama",
        vocab_size=10,
        hidden_size=4,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        head_dim=2,
        intermediate_size=8,
        max_position_embeddings=64,
        norm_eps=1e-5,
        tie_word_embeddings=True,
    )
    fm = FlopModel.of(config)
    assert fm.linear_params == 2 * (4 * (4 + 2 * 2) + 4 * 4 + 3 * 4 * 8)
    assert fm.lm_head_params == 40
    # prompt 3 + 2 outputs: positions 0..3 fed (4 tokens), keys 1+2+3+4, 2 sampled rows.
    expected = 2 * fm.linear_params * 4 + 2 * 40 * 2 + 4 * 2 * 2 * 2 * 10
    assert fm.workload_flops([BenchRequest([1, 2, 3], 2)]) == expected


def test_prefill_is_measured_on_prompts_not_found_in_the_prefix_cache(checkpoint: Path) -> None:
    engine = _engine(checkpoint)
    workload = replace(WORKLOAD, min_prompt=40, max_prompt=48).build(engine)  # whole blocks
    flop_model = FlopModel.of(engine.model.config)
    first = measure_prefill(engine, workload, flop_model, peak=1.0)
    assert first["cached_prompt_tokens"] == 0
    prompts_only = [BenchRequest(r.prompt_token_ids, 1) for r in workload]
    again = measure(engine, engine_requests(prompts_only, "again-"))
    assert sum(step.cached_prompt_tokens for step in again.run.steps) > 0  # they were cached

    second = measure_prefill(engine, workload, flop_model, peak=1.0)

    assert second["cached_prompt_tokens"] == 0
    assert second["prompt_tokens"] == sum(len(r.prompt_token_ids) for r in workload)


def test_prefill_heavy_keeps_the_requests_and_seed_with_long_prompts() -> None:
    heavy = Workload(requests=5, seed=3).prefill_heavy()

    assert (heavy.requests, heavy.seed) == (5, 3)
    # the prompts' mean at least 4x the outputs' (the prefill-heavy: ≥ 4x)
    assert heavy.min_prompt + heavy.max_prompt >= 4 * (heavy.min_output + heavy.max_output)


def _cli(checkpoint: Path, args: str) -> Any:
    return CliRunner().invoke(bench, ["engine", "--model", str(checkpoint), *args.split()])


def test_cli_prints_json_and_writes_the_result_file(checkpoint: Path, tmp_path: Path) -> None:
    result = _cli(
        checkpoint,
        "--device cpu --max-num-seqs 4 --num-kv-blocks 64 --requests 3 --min-prompt 4 "
        "--max-prompt 6 --min-output 2 --max-output 4 --sequential-requests 1 "
        f"--static-batch 2 --static-batches 1 --gemm-size 64 --json --out {tmp_path}",
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["contenders"]["engine"]["output_tokens"] == report["workload"]["output_tokens"]
    (written,) = tmp_path.glob("*-engine-*.json")
    assert json.loads(written.read_text()) == report


def test_cli_prints_a_summary(checkpoint: Path) -> None:
    result = _cli(
        checkpoint,
        "--num-kv-blocks 64 --requests 2 --min-prompt 4 --max-prompt 6 --min-output 2 "
        "--max-output 4 --sequential-requests 1 --static-batch 2 --static-batches 1 "
        "--gemm-size 64",
    )
    assert result.exit_code == 0, result.output
    assert "engine" in result.stdout and "engine_vs_static" in result.stdout


def test_cli_rejects_a_workload_longer_than_the_context(checkpoint: Path) -> None:
    result = _cli(
        checkpoint,
        "--max-model-len 64 --num-kv-blocks 8 --max-prompt 60 --min-output 4 --max-output 10",
    )
    assert result.exit_code != 0
    assert "max_model_len 64" in result.output


def test_without_transformers_the_engine_still_runs(
    checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def missing() -> Any:
        raise ImportError("No module named 'transformers'")

    monkeypatch.setattr("ops.bench.engine._transformers", missing)
    options = replace(OPTIONS, workload=replace(WORKLOAD, requests=2))
    report = run_bench(_engine(checkpoint), options)
    c = report["contenders"]
    assert c["engine"]["output_tokens"] == c["engine"]["expected_output_tokens"]
    assert "not installed" in c["transformers_sequential"]["skipped"]
    assert "not installed" in c["transformers_static"]["skipped"]
    assert report["ratios"] == {"engine_vs_sequential": None, "engine_vs_static": None}
    assert report["targets"]["engine_vs_static"]["met"] is None
    assert report["environment"]["transformers"] is None


def test_batch1_and_step_breakdowns(report: dict[str, Any]) -> None:
    one = report["batch1"]
    assert one["prompt_tokens"] + one["new_tokens"] <= 256
    assert one["decode_tokens_per_s"] > 0 and one["decode_step_ms"] > 0
    for breakdown in (one["breakdown"], report["contenders"]["engine"]["step_time"]):
        assert breakdown["steps"] > 0
        parts = breakdown["ms_per_step"]
        assert set(parts) == {"schedule", "prepare", "dense", "attention", "sample", "collect",
                              "other"}  # fmt: skip
        assert all(ms >= 0 for ms in parts.values())
        assert parts["dense"] > 0
        assert sum(parts.values()) == pytest.approx(breakdown["step_ms"], rel=0.01, abs=0.01)
    assert one["breakdown"]["steps"] == one["new_tokens"] - 1  # decode steps only
    assert report["contenders"]["engine"]["step_time"]["ms_per_step"]["attention"] > 0
