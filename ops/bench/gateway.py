"""`bench gateway`: what `tokenmill gateway` adds to a request, against a Kafka client.

One worker (`--engine echo`: no model; `torch`: the model) serves two paths in one run, in
rounds taking turns at going first (`alternate`). direct: the bench's load client produces
`GenerateRequest`s to the requests topic and reads the results topic. gateway: the same
requests as `POST /v1/completions` bodies (token-id prompts) to a `tokenmill gateway`
subprocess, which produces them with its own reply topic and answers from the result. The
direct records are made by the gateway's own mapper (`to_asked`), so both paths carry the same
request. Both are closed loops of `concurrency` lanes, each sending its next request once its
last is answered. Per path: requests/s, latency p50/p99 (send → answer back here), CPU seconds
per process; each run has prompts of its own (none found in the worker's prefix cache).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import msgspec
import numpy as np

from actors.kafka.connection import KafkaConnection
from gpu.engine import Engine
from messages.openai_batch import COMPLETIONS_URL
from messages.request import GenerateRequest
from ops.bench.gateway_process import HttpLane, gateway_process, http_lanes
from ops.bench.load import LoadClient, worker
from ops.bench.report import Narrate, Report, alternate, percentiles, quiet, ratio
from ops.bench.rig import CpuMeter, rig
from ops.bench.workload import Workload
from ops.gateway.bodies import to_asked
from ops.models.engine_options import EngineChoice
from ops.models.registry import resolve_model
from ops.worker.echo_engine import EchoEngine, load_echo_model

PATHS = ("direct", "gateway")
DEFAULT_REQUESTS = {"echo": 2000, "torch": 96}  # per run: seconds each on 2 cores
Call = Callable[[int, int], Awaitable[bool]]  # (lane, request index) → answered well


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
    well), the loop's wall time, and the CPU seconds each process spent in it."""

    round: int
    path: str
    latencies_ms: list[float | None]
    wall_s: float
    cpu_s: dict[str, float | None] = field(default_factory=dict)


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
    that process was the limit)."""
    latencies = [x for r in runs for x in r.latencies_ms]
    ok, wall = sum(1 for x in latencies if x is not None), sum(r.wall_s for r in runs)
    cpu = {k: _summed([r.cpu_s[k] for r in runs]) for k in runs[0].cpu_s}
    return {
        "requests": len(latencies), "ok": ok, "errors": len(latencies) - ok,
        "wall_s": round(wall, 3), "requests_per_s": ratio(ok, wall, 1),
        "latency_ms": percentiles(latencies, (50, 99)),
        "cpu_s": cpu, "cores_busy": {k: ratio(v, wall, 2) for k, v in cpu.items()},
    }  # fmt: skip


def compare(runs: Sequence[Run]) -> dict[str, Any]:
    """Each path pooled; the gateway's latency minus the direct one's at each percentile
    (of the two distributions, not per request); the median of the rounds' throughput
    ratios (gateway / direct); the gateway's CPU per request."""
    out = {p: figures([r for r in runs if r.path == p]) for p in PATHS}
    d, g = out["direct"]["latency_ms"], out["gateway"]["latency_ms"]
    added = {q: None if d[q] is None or g[q] is None else round(g[q] - d[q], 2) for q in d}
    rates = {p: [figures([r])["requests_per_s"] for r in runs if r.path == p] for p in PATHS}
    ratios = [ratio(b, a) for a, b in zip(rates["direct"], rates["gateway"], strict=True)]
    known = [x for x in ratios if x is not None]
    median = round(float(np.median(known)), 3) if known and len(known) == len(ratios) else None
    cpu = ratio(out["gateway"]["cpu_s"].get("gateway"), out["gateway"]["ok"], 6)
    return out | {
        "added_latency_ms": added, "throughput_ratio": median, "ratios": ratios,
        "gateway_cpu_us_per_request": None if cpu is None else round(cpu * 1e6),
    }  # fmt: skip


def _summed(values: Sequence[float | None]) -> float | None:
    return None if any(v is None for v in values) else round(sum(cast(list[float], values)), 2)


def body(prompt: list[int], max_tokens: int) -> dict[str, Any]:
    return {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}


def direct_call(client: LoadClient, batch: Sequence[GenerateRequest], within_s: float) -> Call:
    """Produce request i (acked, as the gateway waits for its ack too) and wait for its result."""

    async def call(_lane: int, i: int) -> bool:
        rid = batch[i].id
        await (await client.send(batch[i]))
        return not await client.missing([rid], within_s) and client.arrived[rid].result.ok

    return call


def gateway_call(lanes: Sequence[HttpLane], payloads: Sequence[bytes]) -> Call:
    async def call(lane: int, i: int) -> bool:
        return await lanes[lane].post(COMPLETIONS_URL, payloads[i]) == 200

    return call


def _gateway_flags(o: GatewayBenchOptions) -> dict[str, object]:
    return {"--max-inflight": max(256, o.concurrency), "--request-timeout": o.timeout_s}


async def run_gateway_bench(o: GatewayBenchOptions, say: Narrate = quiet) -> Report:
    """Warm both paths up, then the rounds; the report (`tokenmill bench gateway --help`)."""
    n, c, warm = o.per_run, o.concurrency, o.warm_up
    say(f"reading {o.engine.model}'s tokenizer and config")
    model = await asyncio.to_thread(load_echo_model, resolve_model(o.engine.model))
    # The workload reads only the model's config, tokenizer and max_model_len: echo has them.
    echo = cast(Engine, EchoEngine(model, o.engine.engine))
    spec = Workload(seed=o.seed).fixed(2 * warm + 2 * o.rounds * n, o.prompt_tokens, o.max_output)
    prompts = [q.prompt_token_ids for q in spec.build(echo)]
    bodies = [body(p, o.max_output) for p in prompts]

    def direct_requests(at: int, count: int, tag: str) -> list[GenerateRequest]:
        asked = [to_asked(COMPLETIONS_URL, bodies[at + i], f"{tag}-{i}") for i in range(count)]
        return [a.request for a in asked]

    def payloads(at: int, count: int) -> list[bytes]:
        return [msgspec.json.encode(b) for b in bodies[at : at + count]]

    report = Report(f"gateway-{o.kind}")
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="tokenmill-bench-") as tmp:
        async with rig(o.kafka, Path(tmp), say, o.partitions) as r:
            report["kafka"] = r.facts()
            say(f"worker (--engine {o.kind}): starting")
            first = direct_requests(0, min(c, warm), "first")  # answered: the worker is up
            async with (
                worker(r, o.kind, o.engine, o.kind, first, o.timeout_s) as wk,
                gateway_process(r, wk.topics, _gateway_flags(o), o.timeout_s) as gw,
            ):
                say(f"gateway: listening; {warm} warm-up requests on each path")
                warm_up = direct_call(wk.client, direct_requests(0, warm, "warm"), o.timeout_s)
                await closed_loop(warm_up, warm, c)
                async with http_lanes(gw.port, c) as lanes:
                    await closed_loop(gateway_call(lanes, payloads(warm, warm)), warm, c)
                pids = {"client": os.getpid(), "gateway": gw.proc.pid, "worker": wk.proc.pid}
                meter = CpuMeter({**pids, "broker": r.broker_pid})
                for k, path in enumerate(alternate(PATHS, o.rounds)):
                    at, run = 2 * warm + k * n, Run(k // 2 + 1, path, [], 0.0)
                    say(f"round {run.round}/{o.rounds}, {path}: {n} requests, {c} at a time")
                    async with contextlib.AsyncExitStack() as stack:
                        if path == "direct":
                            batch = direct_requests(at, n, f"run{k}")
                            call = direct_call(wk.client, batch, o.timeout_s)
                        else:
                            lanes = await stack.enter_async_context(http_lanes(gw.port, c))
                            call = gateway_call(lanes, payloads(at, n))
                        meter.start()
                        run.latencies_ms, run.wall_s = await closed_loop(call, n, c)
                        run.cpu_s = meter.read()
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
                    "direct: the same bodies through the gateway's mapper",
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
        report.headline(path, f"{f['requests_per_s']} req/s, latency {f['latency_ms']} ms")
    report.headline("added", f"{report['added_latency_ms']} ms")
    report.headline("ratio", f"{report['throughput_ratio']} (rounds {report['ratios']})")
    busy = report["gateway"]["cores_busy"].get("gateway")
    text = f"{report['gateway_cpu_us_per_request']} µs CPU a request, {busy} cores busy"
    report.headline("gateway cpu", text)
    if o.kind == "torch":  # the worker's engine is the limit: the gateway must keep up
        report.target("throughput_ratio_vs_direct", report["throughput_ratio"], 0.95)
    errors = {p: report[p]["errors"] for p in PATHS}
    if any(errors.values()):
        report["warnings"].append(f"requests not answered well: {errors}")
    return report.finish()
