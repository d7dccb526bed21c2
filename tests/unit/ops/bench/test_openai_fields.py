"""`bench engine --workload openai-fields` on a tiny random-weight model: both comparisons run,
alternating, and the report names their ratios and targets."""

from __future__ import annotations

from pathlib import Path

from gpu.engine import Engine
from gpu.engine_config import EngineConfig
from gpu.loading.loader import load_model
from ops.bench.openai_fields import CHOICES, run_openai_fields
from ops.bench.workload import Workload


def test_the_report_compares_logprobs_and_choices_with_their_baselines(
    tiny_checkpoints: dict[str, Path],
) -> None:
    engine = Engine(load_model(tiny_checkpoints["llama"]), EngineConfig(max_model_len=256))
    workload = Workload(requests=3, min_prompt=8, max_prompt=16, min_output=4, max_output=8)
    said: list[str] = []
    report = run_openai_fields(engine, workload, prefix_tokens=40, say=said.append)
    assert len(said) == 5
    best = report["best"]
    assert best["logprobs_5"]["output_tokens"] == best["without_logprobs"]["output_tokens"]
    n, cached, uncached = best["n4"], best["separate_cached"], best["separate_uncached"]
    assert n["output_tokens"] == cached["output_tokens"] == uncached["output_tokens"]
    assert n["output_tokens"] == 3 * CHOICES * 16
    # n shares each prompt; separate requests share it through the cache, or not at all.
    assert n["prefill_tokens_computed"] < uncached["prefill_tokens_computed"]
    assert uncached["prefill_tokens_computed"] == 3 * CHOICES * 40
    assert set(report["targets"]) == {"logprobs_over_plain", "n4_over_separate_uncached"}
