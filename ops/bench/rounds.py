"""`bench pipeline`'s throughput rounds: the direct engine and the worker run the same
workload one after the other, taking turns at going first, round after round.

On a shared host one engine's throughput drifts by ±10% from one minute to the next, so a
single direct run and a single Kafka run a minute apart measure the host as much as the
pipeline. Each round runs a workload of its own seed (no round finds another's prompts in a
prefix cache); the headline ratio is the median of the rounds' ratios. `run_rounds` drives
them; the rest is pure bookkeeping.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from gpu.engine import Engine
from ops.bench.direct import direct_throughput
from ops.bench.kafka import LoadClient, kafka_throughput
from ops.bench.pipeline_run import PipelineOptions, PipelineRun
from ops.bench.worker import CpuMeter, log_tail
from ops.bench.workload import BenchRequest, host_load, make_workload


def warm_up_workload(engine: Engine, o: PipelineOptions) -> list[BenchRequest]:
    """Run unmeasured on both paths first: a first batch of this size is slower on either
    (first-touched memory, code paths run for the first time, in the worker and in a broker
    started for the run)."""
    return make_workload(engine, o.warm_up_spec())


def round_workloads(engine: Engine, o: PipelineOptions) -> list[list[BenchRequest]]:
    return [make_workload(engine, spec) for spec in o.round_specs()]


DirectRun = Callable[[int, list[BenchRequest]], Awaitable[dict[str, Any]]]


async def direct_run(
    run: PipelineRun,
    engine: Engine,
    thread: ThreadPoolExecutor,
    r: int,
    workload: list[BenchRequest],
    worker: asyncio.subprocess.Process | None,
) -> dict[str, Any]:
    """Round `r`'s direct run on `thread`, metered as a Kafka run is: CPU seconds of this
    process (the direct engine here), the `worker` (idle, when it is up) and the broker."""
    worker_pid = worker.pid if worker is not None else None
    meter = CpuMeter({"this_process": os.getpid(), "worker": worker_pid, "broker": run.broker_pid})
    meter.start()
    loop = asyncio.get_running_loop()
    d = await loop.run_in_executor(thread, direct_throughput, engine, workload, f"direct-{r}-")
    return d | {"cpu_s": meter.read()}


async def run_rounds(
    run: PipelineRun,
    workloads: list[list[BenchRequest]],
    direct: DirectRun,
    client: LoadClient,
    proc: asyncio.subprocess.Process,
    log: Path,
    *,
    interleaved: bool,
) -> dict[str, Any]:
    """Every round, `direct` (round, workload) and the worker (through `client`) each run the
    round's workload; the `throughput` section of the report. Interleaved, the two take turns
    at going first; not (where the two engines cannot be held at once), `direct` hands back
    runs made before the worker started. Raises RuntimeError, with the worker's log, when a
    Kafka run does not get all its results."""
    o = run.options
    load, rounds = [host_load()], []
    for r, workload in enumerate(workloads):
        # Turns at going first, so drift within a round falls on both paths alike (with an
        # odd number of rounds, the direct engine goes first once more).
        order = ("kafka", "direct") if interleaved and r % 2 else ("direct", "kafka")
        measured: dict[str, dict[str, Any]] = {}
        for path in order:
            run.say(f"round {r + 1}/{len(workloads)}, {path}: {len(workload)} requests")
            if path == "direct":
                measured[path] = await direct(r, workload)
                continue
            meter = run.meter(proc)
            k = await kafka_throughput(client, workload, f"kafka-{r}-", meter, o.timeout_s)
            if k["results"] < k["requests"]:
                raise RuntimeError(
                    f"round {r + 1}: {k['results']} of {k['requests']} results came back "
                    f"within {o.timeout_s} s:\n{log_tail(log)}"
                )
            measured[path] = k
        rounds.append(round_report(r, o.round_specs()[r].seed, order[0], measured))
    return throughput_report(rounds, [*load, host_load()]) | {"interleaved": interleaved}


def round_report(
    r: int, seed: int, first: str, measured: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    """One round's direct and Kafka figures, its ratio, and how many outputs agree. Takes the
    token lists out of `measured`'s dicts (they are compared, not reported)."""
    d, k = measured["direct"], measured["kafka"]
    tokens, results = d.pop("tokens"), k.pop("results_tokens")
    # Greedy on both paths; batches differ, so float rounding may rarely part them.
    k["outputs_matching_direct"] = sum(
        1 for got, want in zip(results, tokens, strict=True) if got == want
    )
    rate, direct_rate = k["output_tokens_per_s"], d["output_tokens_per_s"]
    ratio = round(rate / direct_rate, 3) if rate and direct_rate else None
    return {"round": r + 1, "seed": seed, "first": first, "direct": d, "kafka": k, "ratio": ratio}


def throughput_report(rounds: list[dict[str, Any]], load: list[float | None]) -> dict[str, Any]:
    """The rounds; as the headline, the median of their ratios (None if any round has none),
    and beside it each path's figures pooled over the rounds."""
    ratios = [r["ratio"] for r in rounds]
    known = [x for x in ratios if x is not None]
    return {
        "direct": pooled([r["direct"] for r in rounds]),
        "kafka": pooled([r["kafka"] for r in rounds]),
        "ratio": round(float(np.median(known)), 3) if len(known) == len(ratios) else None,
        "ratios": ratios,
        "rounds": rounds,
        "host_load_1m": load,
    }


def pooled(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Several runs' figures as one: summed tokens and wall time, CPU seconds by process."""
    tokens, wall = sum(r["output_tokens"] for r in runs), sum(r["wall_s"] for r in runs)
    cpu = {
        name: None
        if any(r["cpu_s"].get(name) is None for r in runs)
        else round(sum(r["cpu_s"][name] for r in runs), 2)
        for name in runs[0]["cpu_s"]
    }
    out = {
        "requests": sum(r["requests"] for r in runs),
        "output_tokens": tokens,
        "wall_s": round(wall, 3),
        "output_tokens_per_s": round(tokens / wall, 2) if wall > 0 else None,
        "cpu_s": cpu,
    }
    for key in ("results", "errors", "outputs_matching_direct", "steps"):
        if all(key in r for r in runs):
            out[key] = sum(r[key] for r in runs)
    return out
