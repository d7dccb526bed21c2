"""`bench pipeline --only tracing`: the cost of tracing. Echo workers (the worst case: no model,
so the per-request work around the engine is all there is) and workers on the model, each
flooded with tracing off and on (sampled at 1.0 into a Jaeger started for the run), in
alternating rounds; CPU is metered per process (worker, span export, Jaeger)."""

from __future__ import annotations

import asyncio
import statistics
from typing import Any

from msgspec.structs import replace

from messages.request import GenerateRequest
from ops.bench.load import flood, worker
from ops.bench.report import alternate
from ops.bench.rig import Rig, child_pid
from ops.errors import OpsError
from ops.services.jaeger import LocalJaeger
from ops.services.jaeger_build import is_built

# `o` below is `bench pipeline`'s PipelineOptions, not imported: pipeline imports this module.

TARGET_TRACING_RATIO = 0.95


async def tracing_section(r: Rig, o: Any) -> dict[str, Any]:
    """Requests/s with tracing off and on, echo and model."""
    if not is_built():
        return {"skipped": "Jaeger is not built here (`tokenmill up --jaeger` builds it)"}
    jaeger = LocalJaeger(state_dir=r.tmp / "jaeger", ui_port=0, otlp_grpc_port=0, otlp_http_port=0)
    r.say("jaeger: starting a collector for the traced runs")
    try:
        await asyncio.to_thread(jaeger.start, 120)
    except OpsError as exc:
        return {"skipped": f"Jaeger did not start: {exc}"}
    p = o.echo_prompt_tokens  # prompts any vocabulary has
    prompts = [[(i * 31 + k) % 250 + 3 for k in range(p)] for i in range(o.tracing_requests)]
    try:
        report = await _alternate(r, o, jaeger, "echo", prompts, p, warm=500)
        report["engine"] = "echo (no model: the per-request work around the engine is all)"
        if o.tracing_model_requests:
            model = prompts[: o.tracing_model_requests]
            report["model"] = await _alternate(
                r, o, jaeger, "torch", model, o.latency_max_new_tokens, warm=2
            )
            report["model"]["engine"] = f"{o.engine.model} ({o.engine.device})"
    finally:
        await asyncio.to_thread(jaeger.stop)
    return report


async def _alternate(
    r: Rig, o: Any, jaeger: LocalJaeger, kind: str, prompts: list[list[int]], new_tokens: int,
    *, warm: int,
) -> dict[str, Any]:  # fmt: skip
    """`tracing_rounds` × (off, on) floods of one workload, each on a fresh `kind` worker."""
    on_env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": jaeger.otlp_http,
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "1.0",
    }
    runs: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    for i, mode in enumerate(alternate(("off", "on"), o.tracing_rounds)):
        name = f"trace-{kind}-{mode}-{i // 2}"
        requests = [
            GenerateRequest(id=f"{name}-{j}", prompt_token_ids=ids, max_new_tokens=new_tokens)
            for j, ids in enumerate(prompts)
        ]
        r.say(f"tracing {mode}, {kind} (round {i // 2 + 1}): {len(requests)} requests")
        env = on_env if mode == "on" else {}
        warming = [replace(q, id=f"warm-{q.id}") for q in requests[:warm]]
        async with worker(r, name, o.engine, kind, warming, o.timeout_s, env=env, linger_ms=5) as w:
            # traced: its span export process (a child of the worker) and Jaeger are metered too
            pids = {"span_export": child_pid(w.proc.pid), "jaeger": jaeger.pid} if env else {}
            runs[mode].append(await flood(w.client, requests, r.meter(w.proc, **pids), o.timeout_s))
    off = [x["requests_per_s"] for x in runs["off"] if x["requests_per_s"]]
    on = [x["requests_per_s"] for x in runs["on"] if x["requests_per_s"]]
    ratio = round(statistics.mean(on) / statistics.mean(off), 3) if off and on else None
    cpu_off, cpu_on = _cpu_us(runs["off"], "worker"), _cpu_us(runs["on"], "worker")
    added = None if cpu_on is None or cpu_off is None else round(cpu_on - cpu_off, 1)
    return {
        "sampling": 1.0, "collector": "Jaeger v2, OTLP/HTTP, on this machine",
        "rounds": o.tracing_rounds, "off": runs["off"], "on": runs["on"],
        "requests_per_s": {"off": off, "on": on}, "ratio_on_vs_off": ratio,
        "worker_cpu_us_per_request": {"off": cpu_off, "on": cpu_on},
        "tracing_cpu_us_per_request": added,
        # Spent outside the worker's process, with tracing on: other cores on a real host.
        "tracing_cpu_us_per_request_elsewhere": {
            n: _cpu_us(runs["on"], n) for n in ("span_export", "jaeger")
        },
        "target_ratio_at_least": TARGET_TRACING_RATIO,
        "met": None if ratio is None else ratio >= TARGET_TRACING_RATIO,
    }  # fmt: skip


def _cpu_us(runs: list[dict[str, Any]], process: str) -> float | None:
    """CPU µs per request of `process` over `runs`; None when not metered."""
    cpu = [x["cpu_s"].get(process) for x in runs]
    if not runs or any(c is None for c in cpu):
        return None
    return round(sum(c or 0.0 for c in cpu) / sum(int(x["requests"]) for x in runs) * 1e6, 1)
