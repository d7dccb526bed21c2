"""`bench pipeline`'s throughput rounds (`ops/bench/rounds.py`): how one round is reported, and
how rounds add up."""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from actors.kafka.connection import KafkaConnection
from gpu.engine import Engine
from gpu.engine_config import EngineConfig
from ops.bench import rounds
from ops.bench.kafka import LoadClient
from ops.bench.pipeline_run import PipelineOptions, PipelineRun
from ops.bench.rounds import pooled, round_report, throughput_report
from ops.bench.workload import BenchRequest
from ops.models.engine_options import EngineChoice


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

    report = throughput_report(rounds, [0.1, 0.2])

    assert report["ratios"] == [1.0, 0.5, 0.8]
    assert report["ratio"] == 0.8
    assert report["host_load_1m"] == [0.1, 0.2]
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
    assert throughput_report(rounds, [])["ratio"] is None


def test_pooled_sums_cpu_by_process_and_keeps_unknowns_unknown() -> None:
    runs = [_kafka(10, 1.0, [[1]]), _kafka(30, 3.0, [[1], [2]])]
    for run in runs:
        run.pop("results_tokens")

    total = pooled(runs)

    assert total["requests"] == 3 and total["results"] == 3
    assert total["cpu_s"] == {"worker": 6.0, "client": 0.2, "broker": None}
    assert total["output_tokens_per_s"] == 10.0
    assert "steps" not in total  # Kafka runs have none


# -- run_rounds with its two runs replaced (the real ones: tests/integration/test_bench_pipeline.py)


@dataclass
class _Runs:
    made: list[str] = field(default_factory=list)  # each run's request-id prefix, in order
    lossy_round: int | None = None  # this round's Kafka run loses a result


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch) -> _Runs:
    record = _Runs()

    def direct(engine: object, workload: object, prefix: str) -> dict[str, Any]:
        record.made.append(prefix)
        return _direct(10, 1.0, [[1], [2]])

    async def kafka(
        client: object, workload: object, prefix: str, meter: object, within_s: float
    ) -> dict[str, Any]:
        record.made.append(prefix)
        lossy = prefix == f"kafka-{record.lossy_round}-"
        return _kafka(10, 1.0, [[1], None] if lossy else [[1], [2]])

    monkeypatch.setattr(rounds, "direct_throughput", direct)
    monkeypatch.setattr(rounds, "kafka_throughput", kafka)
    return record


async def _run_rounds(tmp_path: Path, n: int, *, interleaved: bool = True) -> dict[str, Any]:
    choice = EngineChoice(model="m", dtype=None, device=None, engine=EngineConfig())
    options = PipelineOptions(engine=choice, throughput_rounds=n)
    run = PipelineRun(
        options, KafkaConnection("127.0.0.1:9"), None, "r", tmp_path, {}, lambda _: None
    )
    (tmp_path / "worker.log").write_text("the worker's last words\n")
    proc = cast(asyncio.subprocess.Process, SimpleNamespace(pid=os.getpid()))
    engine = cast(Engine, None)
    with ThreadPoolExecutor(1) as thread:
        done = {}  # not interleaved: the direct runs are made before the worker starts
        if not interleaved:
            done = {r: await rounds.direct_run(run, engine, thread, r, [], None) for r in range(n)}

        async def direct(r: int, workload: list[BenchRequest]) -> dict[str, Any]:
            if not interleaved:
                return done[r]
            return await rounds.direct_run(run, engine, thread, r, workload, proc)

        return await rounds.run_rounds(
            run,
            [[]] * n,
            direct,
            cast(LoadClient, None),
            proc,
            tmp_path / "worker.log",
            interleaved=interleaved,
        )


async def test_the_paths_take_turns_at_going_first(runs: _Runs, tmp_path: Path) -> None:
    report = await _run_rounds(tmp_path, 3)

    assert runs.made == [
        "direct-0-",
        "kafka-0-",
        "kafka-1-",
        "direct-1-",
        "direct-2-",
        "kafka-2-",
    ]
    assert [r["first"] for r in report["rounds"]] == ["direct", "kafka", "direct"]
    assert report["interleaved"] is True
    # The direct runs are metered as the worker's are: this process, the worker, the broker.
    cpu = report["rounds"][0]["direct"]["cpu_s"]
    assert set(cpu) == {"this_process", "worker", "broker"}
    assert cpu["broker"] is None  # no broker pid known to this run


async def test_without_turns_the_direct_runs_come_first(runs: _Runs, tmp_path: Path) -> None:
    report = await _run_rounds(tmp_path, 2, interleaved=False)

    assert runs.made == ["direct-0-", "direct-1-", "kafka-0-", "kafka-1-"]
    assert [r["first"] for r in report["rounds"]] == ["direct", "direct"]
    assert report["interleaved"] is False
    assert report["rounds"][0]["direct"]["cpu_s"]["worker"] is None  # no worker yet


async def test_a_kafka_run_missing_results_ends_the_rounds_with_the_workers_log(
    runs: _Runs, tmp_path: Path
) -> None:
    runs.lossy_round = 1

    with pytest.raises(RuntimeError, match="round 2: 1 of 2 results") as caught:
        await _run_rounds(tmp_path, 3)

    assert "the worker's last words" in str(caught.value)
    assert runs.made == ["direct-0-", "kafka-0-", "kafka-1-"]  # no round waits after it
