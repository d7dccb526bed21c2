"""`bench pipeline`'s pure parts (`ops/bench/pipeline.py`): its workloads' seeds, what the
worker is given, the order of the throughput rounds, how one round is reported and how rounds
add up. The runs themselves: tests/integration/test_bench_pipeline.py."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest

from gpu.engine import Engine
from gpu.engine_config import EngineConfig
from ops.bench.pipeline import (
    WARM_UP_REQUESTS,
    PipelineOptions,
    first_path,
    pooled,
    round_report,
    throughput_report,
    with_kv_pool_of,
)
from ops.bench.workload import Workload
from ops.models.engine_options import EngineChoice

CHOICE = EngineChoice(model="m", dtype=None, device=None, engine=EngineConfig(max_num_seqs=8))


def test_every_workload_has_a_seed_of_its_own() -> None:
    o = PipelineOptions(engine=CHOICE, workload=Workload(seed=7, requests=64), throughput_rounds=3)
    seeds = [s.seed for s in o.round_specs()] + [o.warm_up_spec().seed, o.latency_spec().seed]
    assert seeds == [7, 8, 9, 10, 11]
    assert o.round_specs()[0] == o.workload  # round 1 is `bench engine`'s workload
    assert o.warm_up_spec().requests == WARM_UP_REQUESTS
    assert o.latency_spec().requests == o.latency_requests
    assert o.warm_up_spec().max_prompt == o.workload.max_prompt  # the workload's shape


def test_a_small_workload_warms_up_with_all_its_requests() -> None:
    o = PipelineOptions(engine=CHOICE, workload=Workload(requests=4))
    assert o.warm_up_spec().requests == 4


def test_there_is_at_least_one_round() -> None:
    with pytest.raises(ValueError, match="throughput_rounds"):
        PipelineOptions(engine=CHOICE, throughput_rounds=0)


def test_the_worker_gets_the_direct_engines_kv_pool_size() -> None:
    engine = cast(Engine, SimpleNamespace(num_blocks=321))
    choice = with_kv_pool_of(CHOICE, engine)  # num_kv_blocks None: each would plan its own
    assert choice.engine.num_kv_blocks == 321
    assert choice.engine.max_num_seqs == 8 and choice.model == "m"  # the rest as given


def test_the_paths_take_turns_at_going_first_unless_they_cannot_both_be_held() -> None:
    assert [first_path(i, interleaved=True) for i in range(3)] == ["direct", "kafka", "direct"]
    assert [first_path(i, interleaved=False) for i in range(3)] == ["direct"] * 3


def _direct(tokens: int, wall: float, outputs: list[list[int]]) -> dict[str, Any]:
    return {
        "requests": len(outputs),
        "output_tokens": tokens,
        "wall_s": wall,
        "output_tokens_per_s": round(tokens / wall, 2),
        "steps": 10,
        "cpu_s": {"this_process": 2 * wall, "worker": 0.01, "broker": 0.1},
        "tokens": outputs,
    }


def _kafka(tokens: int, wall: float, outputs: list[list[int] | None]) -> dict[str, Any]:
    return {
        "requests": len(outputs),
        "results": sum(1 for o in outputs if o is not None),
        "errors": 0,
        "output_tokens": tokens,
        "wall_s": wall,
        "output_tokens_per_s": round(tokens / wall, 2),
        "cpu_s": {"worker": 1.5 * wall, "client": 0.1, "broker": None},
        "results_tokens": outputs,
    }


def test_a_round_compares_outputs_and_keeps_no_token_lists() -> None:
    measured = {
        "direct": _direct(100, 1.0, [[1, 2], [3], [4, 5]]),
        "kafka": _kafka(100, 1.25, [[1, 2], None, [4, 6]]),  # one lost, one parted
    }

    r = round_report(0, 7, "direct", measured)

    assert (r["round"], r["seed"], r["first"], r["ratio"]) == (1, 7, "direct", 0.8)
    assert r["kafka"]["outputs_matching_direct"] == 1
    assert "tokens" not in r["direct"] and "results_tokens" not in r["kafka"]


def test_a_round_without_a_kafka_rate_has_no_ratio() -> None:
    kafka = _kafka(0, 0.5, [None])
    kafka["output_tokens_per_s"] = None
    r = round_report(1, 1, "kafka", {"direct": _direct(10, 1.0, [[1]]), "kafka": kafka})
    assert r["ratio"] is None


def test_the_headline_ratio_is_the_median_of_the_rounds() -> None:
    rounds = [
        round_report(
            i, i, "direct", {"direct": _direct(100, 1.0, [[1]]), "kafka": _kafka(100, w, [[1]])}
        )
        for i, w in enumerate((1.0, 2.0, 1.25))  # ratios 1.0, 0.5, 0.8
    ]

    report = throughput_report(rounds)

    assert report["ratios"] == [1.0, 0.5, 0.8]
    assert report["ratio"] == 0.8
    assert report["kafka"]["wall_s"] == 4.25 and report["kafka"]["output_tokens"] == 300
    assert report["kafka"]["output_tokens_per_s"] == round(300 / 4.25, 2)
    assert report["kafka"]["outputs_matching_direct"] == 3


def test_one_round_without_a_ratio_leaves_the_headline_unknown() -> None:
    kafka = _kafka(0, 1.0, [None])
    kafka["output_tokens_per_s"] = None
    rounds = [
        round_report(
            0, 0, "direct", {"direct": _direct(10, 1.0, [[1]]), "kafka": _kafka(10, 1.0, [[1]])}
        ),
        round_report(1, 1, "kafka", {"direct": _direct(10, 1.0, [[1]]), "kafka": kafka}),
    ]
    assert throughput_report(rounds)["ratio"] is None


def test_pooled_sums_cpu_by_process_and_keeps_unknowns_unknown() -> None:
    runs = [_kafka(10, 1.0, [[1]]), _kafka(30, 3.0, [[1], [2]])]
    for run in runs:
        run.pop("results_tokens")

    total = pooled(runs)

    assert total["requests"] == 3 and total["results"] == 3
    assert total["cpu_s"] == {"worker": 6.0, "client": 0.2, "broker": None}
    assert total["output_tokens_per_s"] == 10.0
    assert "steps" not in total  # Kafka runs have none
