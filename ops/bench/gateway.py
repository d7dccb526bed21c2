"""`bench gateway`: what `tokenmill gateway` adds to a request, against a Kafka client.

One worker (`--engine echo`: no model; `torch`: the model) serves four paths in one run, in
rounds taking turns at going first (`alternate`). direct: the bench's load client produces
`GenerateRequest`s to the requests topic and reads the results topic. gateway: the same
requests as `POST /v1/completions` bodies (token-id prompts) to a `tokenmill gateway`
subprocess, which produces them with its own reply topic and answers from the result. The
direct records are made by the gateway's own mapper (`to_asked`), so both paths carry the same
request. direct-stream and gateway-stream: the same with `stream: true`, timed to the first
text besides the end (`ops.bench.gateway_paths`). All are closed loops of `concurrency`
lanes, each sending its next request once its last is answered. Per path: requests/s, latency
p50/p99 (send → answer back here; streamed: also send → first text), CPU seconds per process;
each run has prompts of its own (none found in the worker's prefix cache). The gateway's added
latency is its path's percentile minus the direct path's, plain and streamed.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np

from actors.kafka.connection import KafkaConnection
from gpu.engine import Engine
from ops.bench.gateway_paths import (
    PATHS,
    PLAIN,
    STREAMED,
    Call,
    PathCalls,
    StreamLoadClient,
    body,
    direct_requests,
)
from ops.bench.gateway_process import gateway_process
from ops.bench.load import worker
from ops.bench.report import Narrate, Report, alternate, percentiles, quiet, ratio
from ops.bench.rig import CpuMeter, rig
from ops.bench.workload import Workload
from ops.models.engine_options import EngineChoice
from ops.models.registry import resolve_model
from ops.worker.echo_engine import EchoEngine, load_echo_model

DEFAULT_REQUESTS = {"echo": 2000, "torch": 96}  # per run: seconds each on 2 cores


@dataclass(frozen=True)
class GatewayBenchOptions:
    engine: EngineChoice  # the worker's model and engine options
    kind: str = "echo"  # the worker's --engine: echo | torch
    requests: int | None = None  # per run; None: DEFAULT_REQUESTS[kind]
    concurrency: int = 32
    rounds: int = 3
    prompt_tokens: int = 32
    max_output: int = 32  # new tokens every request asks for
    seed: int = 0
    kafka: KafkaConnection | None = None  # None: start a broker for this run
    partitions: int = 6
    timeout_s: float = 600.0

    @property
    def per_run(self) -> int:
        return self.requests or DEFAULT_REQUESTS[self.kind]

    @property
    def warm_up(self) -> int:  # unmeasured requests on each path before the rounds
        return min(self.per_run, 4 * self.concurrency)


@dataclass
class Run:
    """One path's closed loop in one round: each request's latency (None: not answered
    well), the loop's wall time, and the CPU seconds each process spent in it; a streamed
    path's each time to first text too."""

    round: int
    path: str
    latencies_ms: list[float | None]
    wall_s: float
    cpu_s: dict[str, float | None] = field(default_factory=dict)
    first_ms: list[float | None] = field(default_factory=list)


async def closed_loop(call: Call, count: int, concurrency: int) -> tuple[list[float | None], float]:
    """Requests 0..count-1 on `concurrency` lanes, each taking the next request left as soon
    as its last one is answered: each latency (ms) and the wall time (s)."""
    latencies: list[float | None] = [None] * count
    todo = iter(range(count))

    async def lane(n: int) -> None:
        for i in todo:  # shared by the lanes
            start = time.perf_counter()
            if await call(n, i):
                latencies[i] = (time.perf_counter() - start) * 1e3

    start = time.perf_counter()
    async with asyncio.TaskGroup() as tasks:
        for n in range(min(concurrency, count)):
            tasks.create_task(lane(n))
    return latencies, time.perf_counter() - start


def figures(runs: Sequence[Run]) -> dict[str, Any]:
    """Runs of one path pooled: answered requests over summed wall time, the percentiles of
    every answered request's latency, CPU seconds by process and per wall second (near 1.0:
    that process was the limit); streamed runs' time to first text (`first_text_ms`)."""
    latencies = [x for r in runs for x in r.latencies_ms]
    ok, wall = sum(1 for x in latencies if x is not None), sum(r.wall_s for r in runs)
    cpu = {k: _summed([r.cpu_s[k] for r in runs]) for k in runs[0].cpu_s}
    out = {
        "requests": len(latencies), "ok": ok, "errors": len(latencies) - ok,
        "wall_s": round(wall, 3), "requests_per_s": ratio(ok, wall, 1),
        "latency_ms": percentiles(latencies, (50, 99)),
        "cpu_s": cpu, "cores_busy": {k: ratio(v, wall, 2) for k, v in cpu.items()},
    }  # fmt: skip
    if any(r.first_ms for r in runs):
        out["first_text_ms"] = percentiles([x for r in runs for x in r.first_ms], (50, 99))
    return out


def added(direct: dict[str, Any], gateway: dict[str, Any]) -> dict[str, Any]:
    """The gateway's percentiles minus the direct ones (of the two distributions, not per
    request); None where either is."""
    return {
        q: None if direct[q] is None or gateway[q] is None else round(gateway[q] - direct[q], 2)
        for q in direct
    }


def compare(runs: Sequence[Run]) -> dict[str, Any]:
    """Each path pooled; the latency the gateway adds at each percentile (`added`), plain
    and, where the runs have streamed paths, streamed (to the first text and to the end);
    the median of the plain rounds' throughput ratios (gateway / direct); the gateway's CPU
    per plain request."""
    out = {p: figures([r for r in runs if r.path == p]) for p in PATHS if _ran(runs, p)}
    plain = added(out["direct"]["latency_ms"], out["gateway"]["latency_ms"])
    if all(_ran(runs, p) for p in STREAMED):
        d, g = (out[p] for p in STREAMED)
        out["added_streamed_ms"] = {
            "first_text": added(d["first_text_ms"], g["first_text_ms"]),
            "end": added(d["latency_ms"], g["latency_ms"]),
        }
    rates = {p: [figures([r])["requests_per_s"] for r in runs if r.path == p] for p in PLAIN}
    ratios = [ratio(b, a) for a, b in zip(rates["direct"], rates["gateway"], strict=True)]
    known = [x for x in ratios if x is not None]
    median = round(float(np.median(known)), 3) if known and len(known) == len(ratios) else None
    cpu = ratio(out["gateway"]["cpu_s"].get("gateway"), out["gateway"]["ok"], 6)
    return out | {
        "added_latency_ms": plain, "throughput_ratio": median, "ratios": ratios,
        "gateway_cpu_us_per_request": None if cpu is None else round(cpu * 1e6),
    }  # fmt: skip


def _ran(runs: Sequence[Run], path: str) -> bool:
    return any(r.path == path for r in runs)


def _summed(values: Sequence[float | None]) -> float | None:
    return None if any(v is None for v in values) else round(sum(cast(list[float], values)), 2)


def _gateway_flags(o: GatewayBenchOptions) -> dict[str, object]:
    return {"--max-inflight": max(256, o.concurrency), "--request-timeout": o.timeout_s}


async def run_gateway_bench(o: GatewayBenchOptions, say: Narrate = quiet) -> Report:
    """Warm every path up, then the rounds; the report (`tokenmill bench gateway --help`)."""
    n, c, warm = o.per_run, o.concurrency, o.warm_up
    say(f"reading {o.engine.model}'s tokenizer and config")
    model = await asyncio.to_thread(load_echo_model, resolve_model(o.engine.model))
    # The workload reads only the model's config, tokenizer and max_model_len: echo has them.
    echo = cast(Engine, EchoEngine(model, o.engine.engine))
    count = len(PATHS) * (warm + o.rounds * n)
    spec = Workload(seed=o.seed).fixed(count, o.prompt_tokens, o.max_output)
    bodies = [body(q.prompt_token_ids, o.max_output) for q in spec.build(echo)]

    report = Report(f"gateway-{o.kind}")
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="tokenmill-bench-") as tmp:
        async with rig(o.kafka, Path(tmp), say, o.partitions) as r:
            report["kafka"] = r.facts()
            say(f"worker (--engine {o.kind}): starting")
            first = direct_requests(bodies, 0, min(c, warm), "first")  # answered: the worker is up
            # Streamed requests' chunks go to a reply topic of their own: the worker's load
            # client reads its results topic as results only.
            replies = (await r.topics("stream", ("results",)))["results"]
            async with (
                worker(r, o.kind, o.engine, o.kind, first, o.timeout_s) as wk,
                StreamLoadClient(r.kafka, wk.topics | {"results": replies}) as streams,
                gateway_process(r, wk.topics, _gateway_flags(o), o.timeout_s) as gw,
            ):
                path_call = PathCalls(bodies, wk.client, streams, replies, gw.port, c, o.timeout_s)
                say(f"gateway: listening; {warm} warm-up requests on each path")
                for k, path in enumerate(PATHS):
                    async with path_call(path, k * warm, warm, "warm") as (call, _):
                        await closed_loop(call, warm, c)
                pids = {"client": os.getpid(), "gateway": gw.proc.pid, "worker": wk.proc.pid}
                meter = CpuMeter({**pids, "broker": r.broker_pid})
                for k, path in enumerate(alternate(PATHS, o.rounds)):
                    at, run = len(PATHS) * warm + k * n, Run(k // len(PATHS) + 1, path, [], 0.0)
                    say(f"round {run.round}/{o.rounds}, {path}: {n} requests, {c} at a time")
                    async with path_call(path, at, n, f"run{k}") as (call, streamed):
                        meter.start()
                        run.latencies_ms, run.wall_s = await closed_loop(call, n, c)
                        run.cpu_s = meter.read()
                        run.first_ms = streamed.first_ms if streamed else []
                    runs.append(run)
                argv = {"worker": wk.argv, "gateway": gw.argv}
    return _report(report, o, runs, argv)


def _report(
    report: Report, o: GatewayBenchOptions, runs: list[Run], argv: dict[str, list[str]]
) -> Report:
    report["engine"] = {"kind": o.kind, "model": o.engine.model}
    report["workload"] = {
        "requests_per_run": o.per_run, "concurrency": o.concurrency, "rounds": o.rounds,
        "warm_up_requests_per_path": o.warm_up,
        "prompt_tokens": o.prompt_tokens, "max_new_tokens": o.max_output, "seed": o.seed,
        "requests": "random token ids as the /v1/completions `prompt`, temperature 0; "
                    "direct: the same bodies through the gateway's mapper; the streamed "
                    "paths: the same with `stream: true` (direct: chunks on a reply topic "
                    "of their own; first text: the first chunk with text, or the first "
                    "body bytes of the SSE answer)",
    }  # fmt: skip
    report["processes"] = {
        "client": "this process, one event loop: the direct path's load client (aiokafka) "
                  "and the gateway path's keep-alive HTTP/1.1 lanes (h11)",
        "gateway": "a `tokenmill gateway` subprocess (uvicorn, one process)",
        "worker": f"a `tokenmill worker --engine {o.kind}` subprocess",
        "broker": "started for this run on this machine" if o.kafka is None else "given",
        "argv": argv,
    }  # fmt: skip
    report["runs"] = [{"round": r.round, "path": r.path} | figures([r]) for r in runs]
    report |= compare(runs)
    for path in PATHS:
        f = report[path]
        first = f" first text {f['first_text_ms']} ms," if "first_text_ms" in f else ""
        report.headline(path, f"{f['requests_per_s']} req/s,{first} latency {f['latency_ms']} ms")
    streamed = report["added_streamed_ms"]
    report.headline("added", f"{report['added_latency_ms']} ms")
    report.headline(
        "added streamed", f"first text {streamed['first_text']} ms, end {streamed['end']} ms"
    )
    report.headline("ratio", f"{report['throughput_ratio']} (rounds {report['ratios']})")
    busy = report["gateway"]["cores_busy"].get("gateway")
    text = f"{report['gateway_cpu_us_per_request']} µs CPU a request, {busy} cores busy"
    report.headline("gateway cpu", text)
    added_p50 = report["added_latency_ms"]["p50"]
    report.target("added_latency_p50_ms", added_p50, 5.0, at_most=True)
    report.target("added_first_text_p50_ms", streamed["first_text"]["p50"], 5.0, at_most=True)
    if o.kind == "torch":  # the worker's engine is the limit: the gateway must keep up
        report.target("throughput_ratio_vs_direct", report["throughput_ratio"], 0.95)
    errors = {p: report[p]["errors"] for p in PATHS}
    if any(errors.values()):
        report["warnings"].append(f"requests not answered well: {errors}")
    return report.finish()
