"""`bench pipeline`'s options (`ops/bench/pipeline_run.py`): the model sections' workloads."""

from __future__ import annotations

import pytest

from gpu.engine_config import EngineConfig
from ops.bench.pipeline_run import WARM_UP_REQUESTS, PipelineOptions
from ops.bench.workload import BenchOptions
from ops.models.engine_options import EngineChoice

CHOICE = EngineChoice(model="m", dtype=None, device=None, engine=EngineConfig())


def test_every_workload_has_a_seed_of_its_own() -> None:
    o = PipelineOptions(
        engine=CHOICE, workload=BenchOptions(seed=7, requests=64), throughput_rounds=3
    )

    seeds = [s.seed for s in o.round_specs()] + [o.warm_up_spec().seed, o.latency_spec().seed]

    assert seeds == [7, 8, 9, 10, 11]
    assert o.round_specs()[0] == o.workload  # round 1 is `bench engine`'s workload
    assert o.warm_up_spec().requests == WARM_UP_REQUESTS
    assert o.latency_spec().requests == o.latency_requests
    assert o.warm_up_spec().max_prompt == o.workload.max_prompt  # the workload's shape


def test_a_small_workload_warms_up_with_all_its_requests() -> None:
    o = PipelineOptions(engine=CHOICE, workload=BenchOptions(requests=4))
    assert o.warm_up_spec().requests == 4


def test_there_is_at_least_one_round() -> None:
    with pytest.raises(ValueError, match="throughput_rounds"):
        PipelineOptions(engine=CHOICE, throughput_rounds=0)
