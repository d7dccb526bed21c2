"""`bench pipeline`: the seeded workload through real Kafka and a `tokenmill worker` subprocess,
against the same engine in this process (`tokenmill bench pipeline --help`). The throughput
rounds take turns at going first, each on a seed of its own; the headline is the median of their
ratios (a shared host drifts ±10% from one minute to the next). On a GPU the two engines cannot
both be held: there every direct round runs first, released before the worker starts.
"""

from __future__ import annotations

import asyncio
import gc
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

import numpy as np

from actors.engine_thread import engine_thread
from actors.kafka.connection import KafkaConnection
from gpu.engine import Engine
from messages.request import GenerateRequest
from ops.bench.load import LoadClient, Worker, flood, latency, worker
from ops.bench.report import Narrate, Report, percentiles, quiet, ratio
from ops.bench.rig import CpuMeter, Rig, log_tail, rig
from ops.bench.runs import engine_facts, measure
from ops.bench.workload import BenchRequest, Workload, engine_requests, wire_requests
from ops.models.engine_options import EngineChoice, build_engine
from ops.models.registry import resolve_model
from ops.worker.echo_engine import EchoEngine, load_echo_model

SECTIONS = ("throughput", "latency", "ceiling", "tracing", "exactly_once")
# tracing and exactly_once: on request (--only tracing, --only exactly_once)
DEFAULT_SECTIONS = ("throughput", "latency", "ceiling")
WARM_UP_REQUESTS = 16  # the model sections' unmeasured first batch, on both paths
MAX_LIGHT_RATE = 2.0  # requests/s


@dataclass(frozen=True)
class PipelineOptions:
    engine: EngineChoice  # the direct engine's, and the worker's engine options
    workload: Workload = field(default_factory=Workload)
    sections: tuple[str, ...] = DEFAULT_SECTIONS
    kafka: KafkaConnection | None = None  # None: start a broker for this run
    partitions: int = 6
    throughput_rounds: int = 3
    rate: float | None = None  # latency, requests/s; None: `light_rate`
    latency_requests: int = 20
    latency_max_new_tokens: int = 16
    echo_requests: int = 20_000
    echo_prompt_tokens: int = 16
    tracing_requests: int = 5_000  # per run; runs alternate off, on, off, on
    tracing_model_requests: int = 48  # per run to a worker on the model; 0: echo only
    tracing_rounds: int = 3  # of off and on
    exactly_once_requests: int = 5_000  # per flood; runs alternate without and with
    exactly_once_rounds: int = 3  # of without and with
    exactly_once_model_requests: int = 48  # per run to a worker on the model; 0: echo only
    timeout_s: float = 600.0  # per wait for a worker's results

    def __post_init__(self) -> None:
        if set(self.sections) - set(SECTIONS) or not self.sections:
            raise ValueError(f"sections must be some of {', '.join(SECTIONS)}")
        if (self.rate is not None and self.rate <= 0) or self.timeout_s <= 0:
            raise ValueError("rate and timeout must be positive")
        if self.throughput_rounds < 1:
            raise ValueError("throughput_rounds must be at least 1")

    # Each model workload on a seed of its own, so that none finds another's prompts in a
    # prefix cache: the rounds on seed, seed + 1, ...; then the warm-up; then the latency run.
    def round_specs(self) -> list[Workload]:
        w = self.workload
        return [w.with_seed(w.seed + r) for r in range(self.throughput_rounds)]

    def warm_up_spec(self) -> Workload:
        w = self.workload
        return w.with_seed(w.seed + self.throughput_rounds, min(WARM_UP_REQUESTS, w.requests))

    def latency_spec(self) -> Workload:
        w = self.workload
        return w.with_seed(w.seed + self.throughput_rounds + 1, self.latency_requests)


def light_rate(direct_ms: Sequence[float]) -> float:
    """A rate at which a request seldom meets another in the engine: one per two direct p90s,
    at most `MAX_LIGHT_RATE`. Faster, requests overlap, and batching (not Kafka) adds time."""
    p90_s = float(np.percentile(direct_ms, 90)) / 1e3
    return round(min(MAX_LIGHT_RATE, 0.5 / p90_s), 3)


def with_kv_pool_of(choice: EngineChoice, engine: Engine) -> EngineChoice:
    """The worker's engine options: `choice` with `engine`'s KV pool size (planned from the
    memory left free, a second engine's pool could differ from the first's)."""
    return replace(choice, engine=replace(choice.engine, num_kv_blocks=engine.num_blocks))


def first_path(i: int, *, interleaved: bool) -> str:
    """Which path runs round `i` first: they take turns, so drift within a round falls on both
    alike; not interleaved, the direct runs were made before the worker started."""
    return "kafka" if interleaved and i % 2 else "direct"


def _direct_run(engine: Engine, workload: list[BenchRequest], tag: str, meter: CpuMeter) -> Any:
    """On the engine thread: the workload in one continuous batch, metered as a worker run."""
    meter.start()
    run = measure(engine, engine_requests(workload, tag, ignore_eos=False))
    keep = ("requests", "output_tokens", "wall_s", "output_tokens_per_s", "steps")
    return {k: run.stats()[k] for k in keep} | {"cpu_s": meter.read(), "tokens": run.tokens}


def _direct_latency_ms(engine: Engine, short: list[BenchRequest]) -> list[float]:
    requests = engine_requests(short, "direct-latency-", ignore_eos=False)
    return [measure(engine, [r]).wall_s * 1e3 for r in requests]


async def _model_sections(r: Rig, o: PipelineOptions, report: Report) -> None:
    """Throughput and latency. The direct engine runs its warm-up and latency runs before the
    worker starts; on a CPU it stays (idle, holding its memory) for the rounds, taking turns
    with the worker, and is released before the worker's latency run."""
    thread = engine_thread()
    loop = asyncio.get_running_loop()

    async def direct(fn: Any, *args: Any) -> Any:
        return await loop.run_in_executor(thread, fn, *args)

    def meter(w: Worker | None) -> CpuMeter:
        pid = w.proc.pid if w else None
        return CpuMeter({"this_process": os.getpid(), "worker": pid, "broker": r.broker_pid})

    try:
        r.say(f"loading {o.engine.model}")
        engine: Engine | None = await direct(build_engine, o.engine)
        assert engine is not None
        report["model"] = engine_facts(engine)
        n = o.latency_max_new_tokens
        short = [BenchRequest(q.prompt_token_ids, n) for q in o.latency_spec().build(engine)]
        warm = o.warm_up_spec().build(engine)
        await direct(measure, engine, engine_requests(warm, "warm-", ignore_eos=False))
        direct_ms: list[float] = []
        if "latency" in o.sections:
            r.say(f"direct engine: {len(short)} requests one at a time")
            direct_ms = await direct(_direct_latency_ms, engine, short)
        choice = with_kv_pool_of(o.engine, engine)
        report["worker"]["kv_blocks"] = engine.num_blocks
        # On a GPU each engine plans its pool from what is left: not both can be held there,
        # so every direct round runs first.
        interleaved = engine.model.device.type == "cpu"
        rounds = [s.build(engine) for s in o.round_specs()] if "throughput" in o.sections else []
        done = {}
        for i, w in enumerate([] if interleaved else rounds):
            r.say(f"direct engine, round {i + 1}/{len(rounds)}: {len(w)} requests")
            done[i] = await direct(_direct_run, engine, w, f"direct-{i}-", meter(None))
        if not interleaved or not rounds:
            engine = None  # released: the worker has the host alone
        gc.collect()
        warm_wire = wire_requests(warm, "warm-")
        async with worker(r, "torch", choice, "torch", warm_wire, o.timeout_s) as wk:
            r.say("worker (torch): started and warmed up")
            results = []
            for i, w in enumerate(rounds):
                first = first_path(i, interleaved=interleaved)
                got: dict[str, dict[str, Any]] = {}
                for path in (first, "kafka" if first == "direct" else "direct"):
                    r.say(f"round {i + 1}/{len(rounds)}, {path}: {len(w)} requests")
                    if path == "direct":
                        got[path] = done.get(i) or await direct(
                            _direct_run, engine, w, f"direct-{i}-", meter(wk)
                        )
                        continue
                    requests = wire_requests(w, f"kafka-{i}-")
                    k = got[path] = await flood(wk.client, requests, r.meter(wk.proc),
                                                o.timeout_s, True)  # fmt: skip
                    if k["results"] < k["requests"]:
                        raise RuntimeError(
                            f"round {i + 1}: {k['results']} of {k['requests']} results came "
                            f"back within {o.timeout_s} s:\n{log_tail(wk.log)}"
                        )
                results.append(round_report(i, o.round_specs()[i].seed, first, got))
            if results:
                report["throughput"] = throughput_report(results) | {"interleaved": interleaved}
            engine = None  # released: the worker's latency run has the host alone
            gc.collect()
            if "latency" in o.sections:
                report["latency"] = await _latency(r, o, wk.client, short, direct_ms)
        _note(report, "torch", wk)
    finally:
        # Not waiting: after an error or a cancel, a run still on the thread ends by itself.
        thread.shutdown(wait=False, cancel_futures=True)


def _note(report: Report, kind: str, w: Worker) -> None:
    for key, value in (("argv", w.argv), ("warm_up_s", w.warm_up_s), ("exit_code", w.exit_code)):
        report["worker"][key][kind] = value


def round_report(i: int, seed: int, first: str, got: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One round's figures, its ratio, and how many outputs agree (the token lists go)."""
    d, k = got["direct"], got["kafka"]
    tokens, results = d.pop("tokens"), k.pop("results_tokens")
    # Greedy on both paths; batches differ, so float rounding may rarely part them.
    k["outputs_matching_direct"] = sum(1 for a, b in zip(results, tokens, strict=True) if a == b)
    rate = ratio(k["output_tokens_per_s"], d["output_tokens_per_s"])
    return {"round": i + 1, "seed": seed, "first": first, "direct": d, "kafka": k, "ratio": rate}


def throughput_report(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The rounds; the median of their ratios (None if any has none); each path pooled."""
    ratios = [r["ratio"] for r in rounds]
    known = [x for x in ratios if x is not None]
    return {
        "direct": pooled([r["direct"] for r in rounds]),
        "kafka": pooled([r["kafka"] for r in rounds]),
        "ratio": round(float(np.median(known)), 3) if len(known) == len(ratios) else None,
        "ratios": ratios,
        "rounds": rounds,
    }


def pooled(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Several runs' figures as one: summed tokens and wall time, CPU seconds by process."""
    cpu = [r["cpu_s"] for r in runs]
    out = {k: sum(r[k] for r in runs) for k in ("requests", "output_tokens", "wall_s")}
    out["output_tokens_per_s"] = ratio(out["output_tokens"], out["wall_s"], 2)
    out["wall_s"] = round(out["wall_s"], 3)
    out["cpu_s"] = {
        n: None if any(c.get(n) is None for c in cpu) else round(sum(c[n] for c in cpu), 2)
        for n in cpu[0]
    }
    keys = ("results", "errors", "outputs_matching_direct", "steps")
    return out | {k: sum(r[k] for r in runs) for k in keys if all(k in r for r in runs)}


async def _latency(
    r: Rig, o: PipelineOptions, client: LoadClient, short: list[BenchRequest], direct: list[float]
) -> dict[str, Any]:
    rate = o.rate or light_rate(direct)
    r.say(f"kafka: {len(short)} requests at {rate}/s")
    k = await latency(client, wire_requests(short, "latency-"), rate, o.timeout_s)
    d, e2e = percentiles(direct), k["end_to_end_ms"]
    added = {p: None if e2e[p] is None or d[p] is None else round(e2e[p] - d[p], 2)
             for p in ("p50", "p99")}  # fmt: skip
    return {
        "rate_per_s": rate,
        "rate_chosen": "given" if o.rate else "auto: min(2, 0.5 / direct p90 s)",
        # Near or above 1, requests overlap in the engine: the added ms include batching.
        "offered_load": round(rate * float(np.mean(direct)) / 1e3, 2),
        "requests": len(short), "max_new_tokens": o.latency_max_new_tokens,
        "direct_ms": d, "kafka": k, "added_ms": added,
    }  # fmt: skip


async def _ceiling(r: Rig, o: PipelineOptions, report: Report) -> None:
    """The echo worker at a light rate, then fed as fast as this process produces."""
    r.say(f"echo: reading {o.engine.model}'s tokenizer and config")
    path = resolve_model(o.engine.model)
    model = await asyncio.to_thread(load_echo_model, path, name=o.engine.model)
    n, p = o.echo_requests, o.echo_prompt_tokens
    # The workload reads only the model's config, tokenizer and max_model_len: echo has them.
    echo = cast(Engine, EchoEngine(model, o.engine.engine))
    prompts = [q.prompt_token_ids for q in o.workload.fixed(n, p, p).build(echo)]

    def requests(kind: str, count: int) -> list[GenerateRequest]:
        text = kind == "text"
        return [
            GenerateRequest(
                id=f"echo-{kind}-{i}",
                max_new_tokens=p,
                prompt=model.tokenizer.decode(prompts[i % n]) if text else None,
                prompt_token_ids=None if text else prompts[i % n],
            )
            for i in range(count)
        ]

    report["model"] = (report["model"] or {"name": model.name, "arch": model.config.arch}) | {
        "echo_digest": model.digest
    }
    rate = o.rate or MAX_LIGHT_RATE
    # Enough to warm the broker's JIT too: a cold JVM broker costs twice the CPU per request.
    warm = requests("warm", min(2000, 2 * n))
    async with worker(r, "echo", o.engine, "echo", warm, o.timeout_s, linger_ms=5) as w:
        r.say(f"kafka: {o.latency_requests} echo requests at {rate}/s")
        async with LoadClient(r.kafka, w.topics) as one_by_one:
            floor = await latency(
                one_by_one, requests("light", o.latency_requests), rate, o.timeout_s
            )
        report["ceiling"] = {
            "engine": "echo (no model; each result is its prompt's tokens)",
            "prompt_tokens": p, "max_new_tokens": p,
            "latency_at_light_rate": {"rate_per_s": rate, **floor},  # the plumbing's own floor
        }  # fmt: skip
        for kind, label in (("ids", "prompt_token_ids"), ("text", "text_prompts")):
            r.say(f"kafka: {n} echo requests with {label}, as fast as they go")
            run = await flood(w.client, requests(kind, n), r.meter(w.proc), o.timeout_s)
            report["ceiling"][label] = run
    _note(report, "echo", w)


async def run_bench(o: PipelineOptions, say: Narrate = quiet) -> Report:
    """Run the chosen sections; the report (see `ops/bench/cli.py`)."""
    from ops.bench.exactly_once import exactly_once_section
    from ops.bench.tracing import tracing_section

    report = Report("pipeline")
    skipped = {"skipped": "not selected (--only)"}
    w = o.workload
    report |= {"model": None, "sections": list(o.sections)} | dict.fromkeys(SECTIONS, skipped)
    mode = "subprocess: `tokenmill worker`, its own process (no GIL shared with the client)"
    report["worker"] = {"mode": mode, "argv": {}, "warm_up_s": {}, "exit_code": {}}
    report["workload"] = w.describe([]) | {
        "prompts": "uniform random token ids (bench engine's), sent as prompt_token_ids",
        "sampling": "greedy; EOS honoured on both paths (the wire has no ignore_eos)",
        "throughput_round_seeds": [s.seed for s in o.round_specs()],
        "warm_up": {"seed": o.warm_up_spec().seed, "requests": o.warm_up_spec().requests},
        "latency_seed": o.latency_spec().seed,
    }
    with tempfile.TemporaryDirectory(prefix="tokenmill-bench-") as tmp:
        async with rig(o.kafka, Path(tmp), say, o.partitions) as r:
            report["kafka"] = r.facts()
            if {"throughput", "latency"} & set(o.sections):
                await _model_sections(r, o, report)
            if "ceiling" in o.sections:
                await _ceiling(r, o, report)
            if "tracing" in o.sections:
                report["tracing"] = await tracing_section(r, o)
            if "exactly_once" in o.sections:
                report["exactly_once"] = await exactly_once_section(r, o)
    t, lat, c = report["throughput"], report["latency"], report["ceiling"]
    report.target("throughput_ratio_vs_direct", t.get("ratio"), 0.95)
    report.target("latency_added_p50_ms", lat.get("added_ms", {}).get("p50"), 10.0, at_most=True)
    # Set for 2 cores with the broker on the same machine (see host for this one's).
    for name, kind in (("", "prompt_token_ids"), ("_text", "text_prompts")):
        value = c.get(kind, {}).get("requests_per_s")
        report.target(f"ceiling{name}_requests_per_s", value, 10_000)
    if "ratio" in t:
        report.headline("throughput", f"ratio {t['ratio']} (rounds {t['ratios']})")
    if "added_ms" in lat:
        report.headline("latency", f"added {lat['added_ms']} ms (p50 and p99)")
    eos = report["exactly_once"]
    if "ratio_exactly_once_vs_at_least_once" in eos:
        ratio_eos = eos["ratio_exactly_once_vs_at_least_once"]
        report.target("exactly_once_echo_throughput_ratio", ratio_eos, 0.9)
        added_eos = eos["latency_added_ms"]
        text = f"echo ratio {ratio_eos}, latency added {added_eos} ms"
        if "model" in eos:
            model_ratio = eos["model"]["ratio_exactly_once_vs_at_least_once"]
            report.target("exactly_once_model_throughput_ratio", model_ratio, 0.9)
            text += f"; on the model ratio {model_ratio}"
        report.headline("exactly-once", text)
    if "text_prompts" in c:
        rates = [c[k]["requests_per_s"] for k in ("prompt_token_ids", "text_prompts")]
        report.headline("ceiling", "{} req/s with token ids, {} with text".format(*rates))
    return report.finish()
