"""The pipeline benchmark: `bench engine`'s seeded workload through real Kafka, against the engine.

Three sections (any subset), on one real broker (a local one started on free ports in a temp
dir unless a connection is given) and topics named for this run:

- throughput: the workload run directly on an engine in this process (`run_all`), and through
  Kafka to a worker with the same engine options: output tokens/s of each, and their ratio. In
  rounds (`throughput_rounds`, 3), the two runs taking turns at going first; the headline ratio
  is the rounds' median (`ops/bench/rounds.py` says why).
- latency: short requests at a light fixed rate through Kafka, end to end (just before the
  producer's send → the result fetched here), against the same requests run one at a time on
  the direct engine: the ms Kafka and the actors add at p50 and p99. The default rate is one
  at which requests seldom overlap in the engine; faster, batching adds time too.
- ceiling: a worker with `--engine echo` (no model: each result is its prompt's tokens). Its
  latency at a light rate (the plumbing's floor); then, fed requests as fast as this process
  produces them, requests/s from the first send to the last result, once with
  `prompt_token_ids` (nothing to tokenize) and once with text prompts.

Beside wall times it reports the CPU seconds the worker, this process and the broker used:
on a busy host those say more than wall time does.

The worker is always a `tokenmill worker` subprocess, as deployed: it shares no GIL with this
process's load generator (but the CPUs, and the broker's, yes). The direct engine steps on a
thread of its own, as the worker's does (`ops/bench/direct.py`); in the throughput rounds it
and the worker take turns, each idling (holding its memory) while the other runs, and it is
released before the worker's latency run. Both get the same unmeasured warm-up batch first.
Greedy, and EOS is honoured on both paths (a request on the wire cannot ignore it), so both
generate the same tokens.

`run_bench(options)` returns one JSON-ready dict; it reports targets, never asserts. The load
generator's Kafka side lives in `ops/bench/kafka.py`, the worker subprocess and the CPU meter
in `ops/bench/worker.py`, the report's skeleton, targets and warnings in `ops/bench/report.py`.
"""

from __future__ import annotations

import asyncio
import gc
import tempfile
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np

from actors.engine_thread import engine_thread
from gpu.engine import Engine
from messages.request import GenerateRequest
from ops.bench.broker import broker, delete_topics, kafka_facts
from ops.bench.direct import direct_latency, warm_direct, with_kv_pool_of
from ops.bench.echo_engine import EchoEngine, load_echo_model
from ops.bench.kafka import (
    LoadClient,
    ceiling_run,
    kafka_latency,
    percentiles,
    warm_up,
    wire_requests,
)
from ops.bench.narrate import Narrate
from ops.bench.pipeline_run import PipelineOptions, PipelineRun
from ops.bench.report import skeleton, targets, warnings_for
from ops.bench.rounds import direct_run, round_workloads, run_rounds, warm_up_workload
from ops.bench.tracing import tracing_section
from ops.bench.worker import worker_argv, worker_process
from ops.bench.workload import BenchOptions, BenchRequest, host_load, make_workload
from ops.models.engine_options import build_engine
from ops.models.registry import resolve_model

MAX_LIGHT_RATE = 2.0  # requests/s


def light_rate(direct_ms: Sequence[float]) -> float:
    """A rate at which a request seldom meets another in the engine: one per two direct p90s,
    at most `MAX_LIGHT_RATE`. Faster, requests overlap, and batching (not Kafka) adds time."""
    p90_s = float(np.percentile(direct_ms, 90)) / 1e3
    return round(min(MAX_LIGHT_RATE, 0.5 / p90_s), 3)


# -- the whole benchmark -------------------------------------------------------------------


async def _model_sections(run: PipelineRun) -> None:
    """Throughput and latency. The direct engine runs its warm-up and latency runs before the
    worker starts. On a CPU it stays (idle, holding its memory) for the throughput rounds,
    where it takes turns with the worker, and is released before the worker's latency run;
    on a GPU it runs every round before the worker starts and is released first."""
    o, report, say = run.options, run.report, run.say
    loop = asyncio.get_running_loop()
    thread = engine_thread()
    try:
        say(f"loading {o.engine.model}")
        engine = await loop.run_in_executor(thread, build_engine, o.engine)
        # Its own seed: run on the direct engine before the rounds, round 1's seed would put
        # those prompts in the direct engine's prefix cache and not in the worker's.
        short = [
            BenchRequest(r.prompt_token_ids, o.latency_max_new_tokens)
            for r in make_workload(engine, o.latency_spec())
        ]
        m = engine.model
        report["model"] = {"name": m.name, "digest": m.digest, "arch": m.config.arch}
        dtype = str(m.dtype).removeprefix("torch.")
        report["environment"] |= {"device": str(m.device), "dtype": dtype}
        del m
        warm = warm_up_workload(engine, o)
        await loop.run_in_executor(thread, warm_direct, engine, warm)
        direct_ms: list[float] = []
        load = [host_load()]
        if "latency" in o.sections:
            say(f"direct engine: {len(short)} requests one at a time")
            direct_ms = await loop.run_in_executor(thread, direct_latency, engine, short)
        worker_engine = with_kv_pool_of(o.engine, engine)
        report["worker"]["kv_blocks"] = engine.num_blocks
        # Taking turns needs both engines held at once: on a CPU they share the host's RAM,
        # but on a GPU each plans its KV pool from the memory the other left. There the
        # direct engine runs every round first and is released before the worker starts.
        interleaved = engine.model.device.type == "cpu"
        workloads = round_workloads(engine, o) if "throughput" in o.sections else []
        direct_done: dict[int, dict[str, Any]] = {}
        if not interleaved:
            for r, workload in enumerate(workloads):
                say(f"direct engine, round {r + 1}/{len(workloads)}: {len(workload)} requests")
                direct_done[r] = await direct_run(run, engine, thread, r, workload, None)
        held: Engine | None = engine if interleaved and workloads else None
        del engine  # `held`, when the rounds take turns; else the worker has the host alone
        gc.collect()

        topics = await run.topics("torch")
        log = run.tmp / "worker-torch.log"
        argv, secrets = worker_argv(worker_engine, "torch", run.kafka, topics)
        report["worker"]["argv"]["torch"] = argv[3:]
        async with (
            worker_process(argv, log, env=secrets) as proc,
            LoadClient(run.kafka, topics, linger_ms=0) as client,
        ):
            say("worker (torch): starting and warming up")
            warm_s = await warm_up(client, proc, log, wire_requests(warm, "warm-"), o.timeout_s)
            report["worker"]["warm_up_s"]["torch"] = warm_s
            if workloads:

                async def direct(r: int, workload: list[BenchRequest]) -> dict[str, Any]:
                    if held is None:
                        return direct_done[r]
                    return await direct_run(run, held, thread, r, workload, proc)

                report["throughput"] = await run_rounds(
                    run, workloads, direct, client, proc, log, interleaved=interleaved
                )
                held = None  # released: the worker's latency run has the host to itself
                gc.collect()
            if "latency" in o.sections:
                report["latency"] = await _kafka_latency(run, client, short, direct_ms, load)
        report["worker"]["exit_code"]["torch"] = proc.returncode
    finally:
        # Not waiting: after an error or a cancel, a run still on the thread ends by itself.
        thread.shutdown(wait=False, cancel_futures=True)


async def _kafka_latency(
    run: PipelineRun,
    client: LoadClient,
    short: list[BenchRequest],
    direct_ms: list[float],
    load: list[float | None],
) -> dict[str, Any]:
    """`short` through Kafka at a light rate, against the direct engine's `direct_ms`."""
    o = run.options
    rate = o.rate or light_rate(direct_ms)
    run.say(f"kafka: {len(short)} requests at {rate}/s")
    k = await kafka_latency(client, short, rate, o.timeout_s)
    d = percentiles(direct_ms)
    e2e = k["end_to_end_ms"]
    return {
        "rate_per_s": rate,
        "rate_chosen": "given" if o.rate else "auto: min(2, 0.5 / direct p90 s)",
        # Near or above 1, requests overlap in the engine: the added ms include batching.
        "offered_load": round(rate * float(np.mean(direct_ms)) / 1e3, 2),
        "requests": len(short),
        "max_new_tokens": o.latency_max_new_tokens,
        "direct_ms": d,
        "kafka": k,
        "added_ms": {
            p: round(e2e[p] - d[p], 2) if e2e[p] is not None and d[p] is not None else None
            for p in ("p50", "p99")
        },
        "host_load_1m": [*load, host_load()],
    }


async def _ceiling_section(run: PipelineRun) -> None:
    """The echo worker fed as fast as this process produces: with token ids, then with text."""
    o, report, say = run.options, run.report, run.say
    say(f"echo: reading {o.engine.model}'s tokenizer and config")
    model = await asyncio.to_thread(
        lambda: load_echo_model(resolve_model(o.engine.model), name=o.engine.model)
    )
    n, p = o.echo_requests, o.echo_prompt_tokens
    spec = BenchOptions(
        requests=n, seed=o.workload.seed, min_prompt=p, max_prompt=p, min_output=p, max_output=p
    )
    # make_workload reads only the model's config and tokenizer and max_model_len: echo has them.
    echo = cast(Engine, EchoEngine(model, o.engine.engine))
    prompts = [w.prompt_token_ids for w in make_workload(echo, spec)]
    by_ids = [
        GenerateRequest(id=f"echo-ids-{i}", prompt_token_ids=ids, max_new_tokens=p)
        for i, ids in enumerate(prompts)
    ]
    by_text = [
        GenerateRequest(id=f"echo-text-{i}", prompt=model.tokenizer.decode(ids), max_new_tokens=p)
        for i, ids in enumerate(prompts)
    ]
    # Enough to warm the broker's JIT too: a cold JVM broker costs twice the CPU per request.
    warm = [
        GenerateRequest(id=f"echo-warm-{i}", prompt_token_ids=prompts[i % n], max_new_tokens=p)
        for i in range(2000)
    ]
    named = report["model"] or {"name": model.name, "arch": model.config.arch}
    report["model"] = named | {"echo_digest": model.digest}

    topics = await run.topics("echo")
    log = run.tmp / "worker-echo.log"
    argv, secrets = worker_argv(o.engine, "echo", run.kafka, topics)
    report["worker"]["argv"]["echo"] = argv[3:]
    light = [BenchRequest(ids, p) for ids in prompts[: o.latency_requests]]
    rate = o.rate or MAX_LIGHT_RATE
    async with (
        worker_process(argv, log, env=secrets) as proc,
        LoadClient(run.kafka, topics, linger_ms=5) as client,
    ):
        say("worker (echo): starting and warming up")
        report["worker"]["warm_up_s"]["echo"] = await warm_up(client, proc, log, warm, o.timeout_s)
        load = [host_load()]
        say(f"kafka: {len(light)} echo requests at {rate}/s")
        async with LoadClient(run.kafka, topics, linger_ms=0) as one_by_one:
            echo_latency = await kafka_latency(one_by_one, light, rate, o.timeout_s)
        say(f"kafka: {n} echo requests with prompt_token_ids, as fast as they go")
        ids_run = await ceiling_run(client, by_ids, run.meter(proc), o.timeout_s)
        say(f"kafka: {n} echo requests with text prompts, as fast as they go")
        text_run = await ceiling_run(client, by_text, run.meter(proc), o.timeout_s)
    report["worker"]["exit_code"]["echo"] = proc.returncode
    report["ceiling"] = {
        "engine": "echo (no model; each result is its prompt's tokens)",
        "prompt_tokens": p,
        "max_new_tokens": p,
        # The plumbing's own latency floor: Kafka both ways and the actors, no model.
        "latency_at_light_rate": {"rate_per_s": rate, **echo_latency},
        "prompt_token_ids": ids_run,
        "text_prompts": text_run,
        "host_load_1m": [*load, host_load()],
    }


async def run_bench(options: PipelineOptions, progress: Narrate | None = None) -> dict[str, Any]:
    """Run the chosen sections; a JSON-ready report (see `ops/bench/cli.py`)."""
    o = options
    run_id = uuid.uuid4().hex[:8]
    report = skeleton(o, run_id)
    with tempfile.TemporaryDirectory(prefix="tokenmill-bench-") as tmp:
        say = progress or (lambda _: None)
        async with broker(o.kafka, Path(tmp) / "kafka", say) as (kafka, pid):
            report["kafka"] |= kafka_facts(o.kafka is not None, kafka)
            run = PipelineRun(o, kafka, pid, run_id, Path(tmp), report, say)
            try:
                if {"throughput", "latency"} & set(o.sections):
                    await _model_sections(run)
                if "ceiling" in o.sections:
                    await _ceiling_section(run)
                if "tracing" in o.sections:
                    p = o.echo_prompt_tokens
                    prompts = [
                        [(i * 31 + k) % 250 + 3 for k in range(p)]  # in any vocabulary
                        for i in range(o.tracing_requests)
                    ]
                    report["tracing"] = await tracing_section(run, prompts)
            finally:
                if o.kafka is not None and run.topics_made:
                    await delete_topics(kafka, run.topics_made)
    report["environment"]["host_load_1m_at_end"] = host_load()
    report["targets"] = targets(report)
    report["warnings"] = warnings_for(report)
    return report
