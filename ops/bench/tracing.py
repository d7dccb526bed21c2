"""The cost of tracing: the same worker flood with tracing off and on, in one run.

`tokenmill bench pipeline --only tracing`: a real Jaeger (built once with Go, started for
the run on free ports) collects every span, sampled at 1.0. Two workloads:

- echo: the echo engine runs no model, so the per-request work around the engine — where
  tracing's cost lies — is all there is to measure: the worst case;
- model: the run's model (`--tracing-model-requests` requests of `--latency-max-new-tokens`
  tokens, 0 to skip): what a deployment pays.

Off and on alternate (off, on, off, on, ...) so drift of a shared machine falls on both alike;
the ratio of their mean requests/s is each workload's figure (target: tracing costs at most
5%). CPU is metered per process — the worker, its span export process, Jaeger — so the report
says where tracing's cost lands: on the worker's event loop, which feeds the engine, or on
other cores (which a small host does not have to spare).
"""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from messages.request import GenerateRequest
from ops.bench.kafka import LoadClient, ceiling_run, warm_up
from ops.bench.worker import CpuMeter, child_pids, worker_argv, worker_process
from ops.errors import OpsError
from ops.services.jaeger import LocalJaeger
from ops.services.jaeger_build import is_built

if TYPE_CHECKING:
    from ops.bench.pipeline_run import PipelineRun

TARGET_TRACING_RATIO = 0.95
ROUNDS = 3  # of off then on
MakeRequests = Callable[[str], list[GenerateRequest]]  # id prefix → one run's requests


async def tracing_section(run: PipelineRun, prompts: list[list[int]]) -> dict[str, Any]:
    """Requests/s with tracing off and on, echo and model; `prompts`: token ids."""
    if not is_built():
        return {"skipped": "Jaeger is not built here (`tokenmill up --jaeger` builds it)"}
    o, say = run.options, run.say
    jaeger = LocalJaeger(
        state_dir=run.tmp / "jaeger", ui_port=0, otlp_grpc_port=0, otlp_http_port=0
    )
    say("jaeger: starting a collector for the traced runs")
    try:
        await asyncio.to_thread(jaeger.start, 120)
    except OpsError as exc:
        return {"skipped": f"Jaeger did not start: {exc}"}

    def echo(prefix: str) -> list[GenerateRequest]:
        p = o.echo_prompt_tokens
        return [
            GenerateRequest(id=f"{prefix}-{i}", prompt_token_ids=ids, max_new_tokens=p)
            for i, ids in enumerate(prompts)
        ]

    def model(prefix: str) -> list[GenerateRequest]:
        n = o.latency_max_new_tokens
        return [
            GenerateRequest(id=f"{prefix}-{i}", prompt_token_ids=ids, max_new_tokens=n)
            for i, ids in enumerate(prompts[: o.tracing_model_requests])
        ]

    try:
        report = await _alternate(run, jaeger, "echo", echo, warm=500)
        report["engine"] = "echo (no model: the per-request work around the engine is all)"
        if o.tracing_model_requests:
            report["model"] = await _alternate(run, jaeger, "torch", model, warm=2)
            report["model"]["engine"] = f"{o.engine.model} ({o.engine.device})"
    finally:
        await asyncio.to_thread(jaeger.stop)
    return report


async def _alternate(
    run: PipelineRun, jaeger: LocalJaeger, kind: str, make: MakeRequests, *, warm: int
) -> dict[str, Any]:
    """`ROUNDS` × (off, on) floods of one workload on a `kind` worker, and their figures."""
    on_env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": jaeger.otlp_http,
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "1.0",
    }
    runs: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    for round_ in range(ROUNDS):
        for mode in ("off", "on"):
            name = f"trace-{kind}-{mode}-{round_}"
            requests = make(name)
            run.say(
                f"tracing {mode}, {kind} (round {round_ + 1}/{ROUNDS}): {len(requests)} requests"
            )
            env = on_env if mode == "on" else {}
            runs[mode].append(await _flood(run, kind, name, requests, env, jaeger.pid, warm))
    off = [r["requests_per_s"] for r in runs["off"] if r["requests_per_s"]]
    on = [r["requests_per_s"] for r in runs["on"] if r["requests_per_s"]]
    ratio = round(statistics.mean(on) / statistics.mean(off), 3) if off and on else None
    cpu_us = {mode: _cpu_us(r, "worker") for mode, r in runs.items()}
    cpu_off, cpu_on = cpu_us["off"], cpu_us["on"]
    return {
        "sampling": 1.0,
        "collector": "Jaeger v2, OTLP/HTTP, on this machine",
        "rounds": ROUNDS,
        "off": runs["off"],
        "on": runs["on"],
        "requests_per_s": {"off": off, "on": on},
        "ratio_on_vs_off": ratio,
        "worker_cpu_us_per_request": cpu_us,
        "tracing_cpu_us_per_request": (
            round(cpu_on - cpu_off, 1) if cpu_on is not None and cpu_off is not None else None
        ),
        # Spent outside the worker's process, with tracing on: other cores on a real host.
        "tracing_cpu_us_per_request_elsewhere": {
            name: _cpu_us(runs["on"], name) for name in ("span_export", "jaeger")
        },
        "target_ratio_at_least": TARGET_TRACING_RATIO,
        "met": None if ratio is None else ratio >= TARGET_TRACING_RATIO,
    }


async def _flood(
    run: PipelineRun,
    kind: str,
    name: str,
    requests: list[GenerateRequest],
    env: dict[str, str],
    jaeger: int | None,
    warm: int,
) -> dict[str, Any]:
    o = run.options
    topics = await run.topics(name)
    log: Path = run.tmp / f"worker-{name}.log"
    argv, secrets = worker_argv(o.engine, kind, run.kafka, topics)
    warm_requests = [
        GenerateRequest(id=f"{name}-warm-{i}", prompt_token_ids=r.prompt_token_ids or [1],
                        max_new_tokens=r.max_new_tokens)
        for i, r in enumerate(requests[:warm])
    ]  # fmt: skip
    async with (
        worker_process(argv, log, env=secrets | env) as proc,
        LoadClient(run.kafka, topics, linger_ms=5) as client,
    ):
        await warm_up(client, proc, log, warm_requests, o.timeout_s)
        pids = run.meter(proc).pids
        if env:  # traced: its span export process (a child of the worker) and Jaeger too
            pids |= {"span_export": next(iter(child_pids(proc.pid)), None), "jaeger": jaeger}
        return await ceiling_run(client, requests, CpuMeter(pids), o.timeout_s)


def _cpu_us(runs: list[dict[str, Any]], process: str) -> float | None:
    """CPU µs per request of `process` over `runs`; None when not metered."""
    cpu: list[float | None] = [r["cpu_s"].get(process) for r in runs]
    requests = sum(int(r["requests"]) for r in runs)
    if not runs or any(c is None for c in cpu):
        return None
    return round(sum(c or 0.0 for c in cpu) / requests * 1e6, 1)
