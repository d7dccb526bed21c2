"""`bench engine --speculative …`: the speculative figures, ratios and targets from fake steps
and runs (no model), and one run of the comparison on a tiny random-weight Llama."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpu.engine import Engine
from gpu.engine_config import EngineConfig
from gpu.engine_io import StepStats
from gpu.loading.loader import load_model
from ops.bench.report import Report
from ops.bench.speculative import (
    add_target,
    compare,
    decode_figures,
    run_speculative_bench,
    speculation_figures,
)
from ops.bench.workload import Workload

MS = 1_000_000


def _step(
    ms: float, *, prefill: int = 0, decode: int = 1, seqs: int = 1, verified: int = 0,
    drafted: int = 0, accepted: int = 0,
) -> StepStats:  # fmt: skip
    return StepStats(
        start_ns=0, end_ns=int(ms * MS), num_seqs=seqs, num_prefill_tokens=prefill,
        num_decode_tokens=decode, num_preempted=0, num_waiting=0, num_running=seqs,
        kv_blocks_used=1, kv_blocks_total=8, proposer="ngram" if verified else None,
        num_verified_seqs=verified, num_draft_tokens=drafted, num_accepted_draft_tokens=accepted,
    )  # fmt: skip


# A prefill step (its first token), two plain decode steps and two speculative ones: one
# accepting 3 of 4 guesses (4 tokens out), one accepting 1 of 4 (2 tokens out).
STEPS = [
    (_step(50, prefill=20, decode=0), 1),
    (_step(10), 1),
    (_step(10), 1),
    (_step(15, decode=5, verified=1, drafted=4, accepted=3), 4),
    (_step(15, decode=5, verified=1, drafted=4, accepted=1), 2),
]


def test_decode_figures_count_decode_only_steps_over_their_own_time() -> None:
    d = decode_figures(STEPS)
    assert d["decode_steps"] == 4 and d["decode_tokens"] == 8
    assert d["decode_s"] == pytest.approx(0.05)
    assert d["decode_tokens_per_s"] == pytest.approx(160.0)
    assert d["tokens_per_decode_step"] == 2.0


def test_speculation_figures_from_the_steps() -> None:
    s = speculation_figures(STEPS)
    assert s["proposer"] == "ngram"
    assert (s["draft_tokens"], s["accepted_draft_tokens"], s["verified_seqs"]) == (8, 4, 2)
    assert s["acceptance_rate"] == 0.5
    assert s["tokens_per_verified_seq_step"] == 3.0  # 4 accepted over 2 verified, + 1
    assert (s["decode_steps_speculated"], s["decode_steps_plain"]) == (2, 2)
    assert s["speculated_step_share"] == 0.5
    assert s["speculated_step"] == {"ms": 15.0, "seqs": 1.0, "tokens": 3.0}
    assert s["plain_step"] == {"ms": 10.0, "seqs": 1.0, "tokens": 1.0}


def test_speculation_figures_without_any_speculation() -> None:
    s = speculation_figures(STEPS[:3])
    assert s["proposer"] is None and s["draft_tokens"] == 0
    assert s["acceptance_rate"] is None and s["tokens_per_verified_seq_step"] is None
    assert s["speculated_step_share"] == 0 and s["speculated_step"] is None


def _run(decode: float, output: float) -> dict[str, Any]:
    return {"decode_tokens_per_s": decode, "output_tokens_per_s": output}


def test_compare_takes_each_settings_fastest_run_and_keeps_every_rounds_ratio() -> None:
    runs = {
        "baseline": [_run(50, 40), _run(60, 45), _run(55, 42)],
        "speculative": [_run(120, 90), _run(100, 80), _run(110, 85)],
    }
    c = compare(runs)
    assert c["best"]["baseline"] == _run(60, 45) and c["best"]["speculative"] == _run(120, 90)
    assert c["ratios"] == {"decode_tokens_per_s": 2.0, "output_tokens_per_s": 2.0}
    assert [r["decode_tokens_per_s"] for r in c["round_ratios"]] == [2.4, 1.667, 2.0]


def test_compare_with_the_baseline_alone_has_no_ratios() -> None:
    c = compare({"baseline": [_run(50, 40)]})
    assert c["ratios"] is None and c["round_ratios"] == []


@pytest.mark.parametrize(
    ("kind", "workload", "batch", "name", "target", "met"),
    [
        ("ngram", "copy", 1, "ngram_copy_batch1_decode_vs_baseline", 2.0, True),
        ("draft", "mixed", 1, "draft_mixed_batch1_decode_vs_baseline", 1.4, True),
        ("ngram", "mixed", 64, "ngram_mixed_batch64_output_vs_baseline", 0.95, False),
    ],
)
def test_the_issue_targets_by_case(
    kind: str, workload: str, batch: int, name: str, target: float, met: bool
) -> None:
    report = Report("engine-speculative")
    report["ratios"] = {"decode_tokens_per_s": 2.1, "output_tokens_per_s": 0.9}
    add_target(report, kind, workload, batch)
    assert report["targets"] == {
        name: {"target": target, "at_least": True, "value": 2.1 if met else 0.9, "met": met}
    }


def test_no_target_without_speculation_or_where_the_issue_sets_none() -> None:
    report = Report("engine-speculative")
    report["ratios"] = None
    add_target(report, None, "copy", 1)
    add_target(report, "ngram", "mixed", 1)
    assert report["targets"] == {}


def test_a_run_on_a_tiny_model_reports_both_settings(tiny_checkpoints: dict[str, Path]) -> None:
    config = EngineConfig(max_num_seqs=2, num_kv_blocks=64, speculative="ngram:k=3")
    engine = Engine(load_model(tiny_checkpoints["llama"], device="cpu"), config)
    workload = Workload(requests=3, seed=1, min_prompt=8, max_prompt=16, min_output=12,
                        max_output=20)  # fmt: skip
    report = run_speculative_bench(engine, "mixed", workload, repeats=1)
    json.dumps(report)
    assert report["benchmark"] == "engine-speculative-mixed"
    assert report["speculation"]["config"] == "ngram:k=3,n=1-3"
    assert report["speculation"]["batch"] == 2
    runs = report["runs"]
    assert len(runs["baseline"]) == len(runs["speculative"]) == 1
    expected = report["workload"]["output_tokens"]
    for run in runs["baseline"] + runs["speculative"]:
        assert run["output_tokens"] == expected
        assert run["differing_from_baseline"] == []  # greedy: the same tokens either way
        assert run["decode_tokens_per_s"] > 0
    assert "speculation" not in runs["baseline"][0]
    overall = report["speculation"]["overall"]
    assert overall["draft_tokens"] == sum(
        r["speculation"]["draft_tokens"] for r in runs["speculative"]
    )
    assert set(report["ratios"]) == {"decode_tokens_per_s", "output_tokens_per_s"}
    assert set(report["targets"]) == {"ngram_mixed_batch2_output_vs_baseline"}
