"""The cost of tracing: the same echo worker flood with tracing off and on, in one run.

`tokenmill bench pipeline --only tracing`: a real Jaeger (built once with Go, started for
the run on free ports) collects every span, sampled at 1.0. The echo engine runs no model,
so the per-request work around the engine — where tracing's cost lies — is all there is to
measure: the worst case. Off and on alternate (off, on, off, on, ...) so drift of a shared
machine falls on both alike; the ratio of their mean requests/s is the report's figure
(target: tracing costs at most 5%).
"""

from __future__ import annotations

import asyncio
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any

from messages.request import GenerateRequest
from ops.bench_kafka import LoadClient, ceiling_run, warm_up
from ops.bench_worker import worker_argv, worker_process
from ops.errors import OpsError
from ops.jaeger_build import is_built
from ops.jaeger_local import LocalJaeger

if TYPE_CHECKING:
    from ops.bench_pipeline import _Run

TARGET_TRACING_RATIO = 0.95
ROUNDS = 2  # of off then on


async def tracing_section(run: _Run, prompts: list[list[int]]) -> dict[str, Any]:
    """Requests/s of an echo worker with tracing off and on; `prompts`: token ids."""
    if not is_built():
        return {"skipped": "Jaeger is not built here (`tokenmill up --jaeger` builds it)"}
    o, say = run.options, run.say
    p = o.echo_prompt_tokens
    jaeger = LocalJaeger(
        state_dir=run.tmp / "jaeger", ui_port=0, otlp_grpc_port=0, otlp_http_port=0
    )
    say("jaeger: starting a collector for the traced runs")
    try:
        await asyncio.to_thread(jaeger.start, 120)
    except OpsError as exc:
        return {"skipped": f"Jaeger did not start: {exc}"}
    on_env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": jaeger.otlp_http,
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "1.0",
    }
    runs: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    try:
        for round_ in range(ROUNDS):
            for mode in ("off", "on"):
                requests = [
                    GenerateRequest(
                        id=f"trace-{mode}-{round_}-{i}", prompt_token_ids=ids, max_new_tokens=p
                    )
                    for i, ids in enumerate(prompts)
                ]
                say(f"tracing {mode} (round {round_ + 1}/{ROUNDS}): {len(requests)} echo requests")
                runs[mode].append(
                    await _flood(
                        run, f"trace-{mode}-{round_}", requests, on_env if mode == "on" else {}
                    )
                )
    finally:
        await asyncio.to_thread(jaeger.stop)
    off = [r["requests_per_s"] for r in runs["off"] if r["requests_per_s"]]
    on = [r["requests_per_s"] for r in runs["on"] if r["requests_per_s"]]
    ratio = round(statistics.mean(on) / statistics.mean(off), 3) if off and on else None
    cpu_us = {mode: _worker_cpu_us(r) for mode, r in runs.items()}
    cpu_off, cpu_on = cpu_us["off"], cpu_us["on"]
    return {
        "engine": "echo (no model: the per-request work around the engine is all there is)",
        "sampling": 1.0,
        "collector": "Jaeger v2, OTLP/HTTP, on this machine",
        "rounds": ROUNDS,
        "off": runs["off"],
        "on": runs["on"],
        "requests_per_s": {"off": off, "on": on},
        "ratio_on_vs_off": ratio,
        # What tracing adds to each request's worker CPU: compare it with a request's time
        # on a real model (a SmolLM2 request on CPU takes tens to hundreds of ms).
        "worker_cpu_us_per_request": cpu_us,
        "tracing_cpu_us_per_request": (
            round(cpu_on - cpu_off, 1) if cpu_on is not None and cpu_off is not None else None
        ),
        "target_ratio_at_least": TARGET_TRACING_RATIO,
        "met": None if ratio is None else ratio >= TARGET_TRACING_RATIO,
    }


async def _flood(
    run: _Run, kind: str, requests: list[GenerateRequest], env: dict[str, str]
) -> dict[str, Any]:
    o = run.options
    topics = await run.topics(kind)
    log: Path = run.tmp / f"worker-{kind}.log"
    argv = worker_argv(o.engine, "echo", run.bootstrap, topics)
    warm = [
        GenerateRequest(id=f"{kind}-warm-{i}", prompt_token_ids=r.prompt_token_ids or [1],
                        max_new_tokens=r.max_new_tokens)
        for i, r in enumerate(requests[:500])
    ]  # fmt: skip
    async with (
        worker_process(argv, log, env=env) as proc,
        LoadClient(run.bootstrap, topics, linger_ms=5) as client,
    ):
        await warm_up(client, proc, log, warm, o.timeout_s)
        return await ceiling_run(client, requests, run.meter(proc), o.timeout_s)


def _worker_cpu_us(runs: list[dict[str, Any]]) -> float | None:
    cpu: list[float | None] = [r["cpu_s"].get("worker") for r in runs]
    requests = sum(int(r["requests"]) for r in runs)
    if not runs or any(c is None for c in cpu):
        return None
    return round(sum(c or 0.0 for c in cpu) / requests * 1e6, 1)
