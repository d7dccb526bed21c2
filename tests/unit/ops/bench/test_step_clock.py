"""The step clock: phases add up to the step, and timing a run changes none of its tokens."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu.engine import Engine, EngineRequest
from gpu.engine_config import EngineConfig
from gpu.loading.loader import load_model
from gpu.sequence import SamplingParams
from ops.bench.step_clock import PHASES, StepClock
from ops.models.offline import run_all


def test_breakdown_splits_forward_into_dense_and_attention() -> None:
    clock = StepClock()
    clock.seconds = dict(zip(PHASES, [0.001, 0.002, 0.010, 0.004, 0.001, 0.001], strict=True))
    clock.step_seconds, clock.steps = 0.016, 2
    b = clock.breakdown()
    assert b["steps"] == 2 and b["step_ms"] == 8.0
    assert b["ms_per_step"] == {
        "schedule": 0.5, "prepare": 1.0, "dense": 3.0, "attention": 2.0, "sample": 0.5,
        "collect": 0.5, "other": 0.5,
    }  # fmt: skip
    assert sum(b["fraction"].values()) == pytest.approx(1.0, abs=1e-3)
    clock.reset()
    assert clock.breakdown() == {"steps": 0}


def test_a_timed_run_gives_the_same_tokens(tiny_checkpoints: dict[str, Path]) -> None:
    def tokens(timing: StepClock | None) -> list[list[int]]:
        engine = Engine(load_model(tiny_checkpoints["llama"]), EngineConfig(max_num_seqs=4))
        engine.observe(timing)
        requests = [
            EngineRequest(f"r{i}", [5 + i, 6, 7, 8] * (i + 1), SamplingParams(max_new_tokens=6))
            for i in range(5)
        ]
        return [c.token_ids for c in run_all(engine, requests).completions]

    clock = StepClock()
    assert tokens(clock) == tokens(None)
    assert clock.steps > 0
    assert all(clock.seconds[p] > 0 for p in PHASES)
    assert clock.seconds["attention"] < clock.seconds["forward"]
