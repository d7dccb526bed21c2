"""Speculative decoding's metrics: per-proposer counters and tokens per verified sequence, from
the engine's `StepStats`, through `WorkerMetrics.observe_step` as the worker records them."""

from __future__ import annotations

from typing import Any

import pytest

from actors.telemetry.metrics import WorkerMetrics
from gpu.engine_io import StepStats
from tests.unit.actors.telemetry.test_metrics import scrape, value


def step(**overrides: Any) -> StepStats:
    fields: dict[str, Any] = {
        "start_ns": 0, "end_ns": 1_000_000, "num_seqs": 4, "num_prefill_tokens": 0,
        "num_decode_tokens": 4, "num_preempted": 0, "num_waiting": 0, "num_running": 4,
        "kv_blocks_used": 8, "kv_blocks_total": 64,
    }  # fmt: skip
    return StepStats(**(fields | overrides))


def speculated(proposer: str, verified: int, drafted: int, accepted: int) -> StepStats:
    return step(
        proposer=proposer,
        num_verified_seqs=verified,
        num_draft_tokens=drafted,
        num_accepted_draft_tokens=accepted,
    )


def test_a_step_with_speculation_counts_its_guesses_by_proposer() -> None:
    metrics = WorkerMetrics()
    metrics.observe_step(speculated("ngram", verified=2, drafted=8, accepted=6))
    metrics.observe_step(speculated("ngram", verified=1, drafted=4, accepted=0))
    metrics.observe_step(speculated("draft", verified=4, drafted=16, accepted=8))
    s = scrape(metrics)
    for proposer, counts in {"ngram": (12, 6, 3), "draft": (16, 8, 4)}.items():
        assert counts == tuple(
            value(s, f"tokenmill_speculative_{name}_total", proposer=proposer)
            for name in ("draft_tokens", "accepted_tokens", "verified_seqs")
        )
    # Tokens a verified sequence gained per step: 6/2 + 1 = 4 and 0/1 + 1 = 1 for ngram.
    histogram = "tokenmill_speculative_tokens_per_seq"
    assert value(s, f"{histogram}_count", proposer="ngram") == 2
    assert value(s, f"{histogram}_sum", proposer="ngram") == pytest.approx(5.0)
    assert value(s, f"{histogram}_bucket", proposer="ngram", le="1.0") == 1
    assert value(s, f"{histogram}_sum", proposer="draft") == pytest.approx(3.0)


def test_steps_without_speculation_expose_no_series() -> None:
    metrics = WorkerMetrics()
    metrics.observe_step(step())
    metrics.observe_step(step(num_draft_tokens=3))  # no proposer: not a speculative step
    assert not [key for key in scrape(metrics) if key[0].startswith("tokenmill_speculative_")]


def test_a_proposer_that_verified_nothing_counts_no_tokens_per_sequence() -> None:
    metrics = WorkerMetrics()
    metrics.observe_step(step(proposer="ngram"))
    s = scrape(metrics)
    assert value(s, "tokenmill_speculative_verified_seqs_total", proposer="ngram") == 0
    assert value(s, "tokenmill_speculative_tokens_per_seq_count", proposer="ngram") == 0
