"""The pipeline benchmark: `bench engine`'s seeded workload through real Kafka, against the engine.

Three sections (any subset), on one real broker (a local one started on free ports in a temp
dir unless a bootstrap address is given) and topics named for this run:

- throughput: the workload run directly on an engine in this process (`run_all`), then through
  Kafka to a worker with the same engine options: output tokens/s of each, and their ratio.
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
process's load generator (but the CPUs, and the broker's, yes). The direct engine is measured
and released before the worker starts, so they never compete. Greedy, and EOS is honoured on
both paths (a request on the wire cannot ignore it), so both generate the same tokens.

`run_bench(options)` returns one JSON-ready dict; it reports targets, never asserts.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import platform
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

import aiokafka
import numpy as np
import torch
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.structs import TopicPartition

from actors.config import WorkerConfig
from gpu.echo_engine import EchoEngine, load_echo_model
from gpu.engine import Engine, EngineRequest
from gpu.offline import run_all
from gpu.sequence import SamplingParams
from messages.codec import Codec
from messages.request import GenerateRequest
from messages.result import GenerateResult
from ops.bench_engine import BenchOptions, BenchRequest, host_load, make_workload
from ops.engine_options import EngineChoice, build_engine
from ops.kafka_local import LocalKafka, free_port
from ops.models import resolve_model
from ops.topics import create_topics

SECTIONS = ("throughput", "latency", "ceiling")
TARGET_THROUGHPUT_RATIO = 0.95
TARGET_ADDED_P50_MS = 10.0
TARGET_CEILING_RPS = 10_000.0
MAX_LIGHT_RATE = 2.0  # requests/s
WORKER_MODE = "subprocess: `tokenmill worker`, its own process (no GIL shared with the client)"

Progress = Callable[[str], None]
_requests = Codec(GenerateRequest)
_results = Codec(GenerateResult)


@dataclass(frozen=True)
class PipelineOptions:
    engine: EngineChoice  # the direct engine's, and the worker's engine options
    workload: BenchOptions = field(default_factory=BenchOptions)  # as `bench engine`'s
    sections: tuple[str, ...] = SECTIONS
    bootstrap_servers: str | None = None  # None: start a broker for this run
    partitions: int = 6
    rate: float | None = None  # latency, requests/s; None: light for the engine (`light_rate`)
    latency_requests: int = 20
    latency_max_new_tokens: int = 16
    echo_requests: int = 20_000
    echo_prompt_tokens: int = 16
    timeout_s: float = 600.0  # per wait for a worker's results

    def __post_init__(self) -> None:
        unknown = set(self.sections) - set(SECTIONS)
        if unknown or not self.sections:
            raise ValueError(f"sections must be some of {', '.join(SECTIONS)}")
        if (self.rate is not None and self.rate <= 0) or self.timeout_s <= 0:
            raise ValueError("rate and timeout must be positive")


# -- the load generator's Kafka side -------------------------------------------------------


class LoadClient:
    """Produces requests; a background task fetches results and stamps each on arrival.

    It reads the results topic from its end as it was before anything was sent.
    """

    def __init__(self, bootstrap: str, topics: dict[str, str], *, linger_ms: int) -> None:
        self.topics = topics
        self.producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap,
            acks="all",
            enable_idempotence=True,
            linger_ms=linger_ms,
            max_batch_size=256 << 10,
        )
        self.consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
        self.arrived: dict[str, tuple[float, GenerateResult]] = {}  # id → (perf_counter, result)
        # id → ms from the result record's timestamp (the worker's send) to its fetch here
        self.result_leg_ms: dict[str, float] = {}
        self._pending: set[str] = set()
        self._all_in = asyncio.Event()
        self._collector: asyncio.Task[None] | None = None

    async def __aenter__(self) -> LoadClient:
        await self.producer.start()
        await self.consumer.start()
        partitions = await self.producer.partitions_for(self.topics["results"])
        tps = [TopicPartition(self.topics["results"], p) for p in partitions]
        self.consumer.assign(tps)
        await self.consumer.seek_to_end(*tps)
        for tp in tps:  # resolve positions now, not lazily after results arrive
            await self.consumer.position(tp)
        self._collector = asyncio.create_task(self._collect())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._collector is not None:
            self._collector.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._collector
        await self.consumer.stop()
        await self.producer.stop()

    async def send(self, request_id: str, value: bytes) -> asyncio.Future[Any]:
        """Queue one encoded request; returns the future of its acknowledgement."""
        future: asyncio.Future[Any] = await self.producer.send(
            self.topics["requests"], value=value, key=request_id.encode()
        )
        return future

    async def wait(
        self, ids: Sequence[str], within_s: float
    ) -> dict[str, tuple[float, GenerateResult]]:
        """The arrivals of `ids` once all are in, or whatever came within `within_s` seconds."""
        self._pending = set(ids) - self.arrived.keys()
        self._all_in.clear()
        if self._pending:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._all_in.wait(), within_s)
        return {i: self.arrived[i] for i in ids if i in self.arrived}

    async def _collect(self) -> None:
        while True:
            fetched = await self.consumer.getmany(timeout_ms=100, max_records=10_000)
            now, wall_ms = time.perf_counter(), time.time() * 1e3
            for records in fetched.values():
                for record in records:
                    result = _results.decode(record.value or b"")
                    self.arrived[result.id] = (now, result)
                    self.result_leg_ms[result.id] = wall_ms - record.timestamp
                    self._pending.discard(result.id)
            if not self._pending:
                self._all_in.set()


async def send_all(client: LoadClient, requests: Sequence[GenerateRequest]) -> float:
    """Produce every request as fast as the producer takes them (pre-encoded); returns when the
    first was handed over (perf_counter). Waits for every acknowledgement."""
    values = [(r.id, _requests.encode(r)) for r in requests]
    start = time.perf_counter()
    acks = [await client.send(request_id, value) for request_id, value in values]
    await asyncio.gather(*acks)
    return start


# -- the worker subprocess -----------------------------------------------------------------


def worker_argv(
    choice: EngineChoice, kind: str, bootstrap: str, topics: dict[str, str]
) -> list[str]:
    e = choice.engine
    flags = {
        "--model": choice.model,
        "--engine": kind,
        "--dtype": choice.dtype,
        "--device": choice.device,
        "--max-model-len": e.max_model_len,
        "--max-num-seqs": e.max_num_seqs,
        "--max-batched-tokens": e.max_num_batched_tokens,
        "--num-kv-blocks": e.num_kv_blocks,
        "--bootstrap-servers": bootstrap,
        "--group": f"{topics['requests']}.workers",
        "--requests-topic": topics["requests"],
        "--results-topic": topics["results"],
        "--dlq-topic": topics["dlq"],
        "--worker-id": f"bench-{kind}",
    }
    args = [str(x) for name, value in flags.items() if value is not None for x in (name, value)]
    return [sys.executable, "-c", "from ops.cli import main; main()", "worker", *args]


@contextlib.asynccontextmanager
async def worker_process(argv: list[str], log: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    """Run the worker with only these settings (no TOKENMILL_* from this environment);
    SIGTERM (a drain) on the way out, SIGKILL if it has not exited within a minute."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOKENMILL_")}
    with log.open("ab") as out:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out, env=env
        )
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 60)
            except TimeoutError:
                proc.kill()
                await proc.wait()


async def warm_up(
    client: LoadClient,
    proc: asyncio.subprocess.Process,
    log: Path,
    requests: list[GenerateRequest],
    within_s: float,
) -> float:
    """Send a few requests and wait for their results (model load, group join, first steps).

    Seconds it took; raises RuntimeError with the worker's log if it exits or times out.
    """
    start = await send_all(client, requests)
    waiting = asyncio.ensure_future(client.wait([r.id for r in requests], within_s))
    exited = asyncio.ensure_future(proc.wait())
    await asyncio.wait({waiting, exited}, return_when=asyncio.FIRST_COMPLETED)
    exited.cancel()
    if not waiting.done() or len(waiting.result()) < len(requests):
        waiting.cancel()
        raise RuntimeError(f"the worker did not answer its warm-up requests:\n{_tail(log)}")
    return round(time.perf_counter() - start, 2)


def _tail(log: Path, lines: int = 30) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU seconds process `pid` has used, all threads; None where unknown."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


class CpuMeter:
    """CPU seconds each named process uses between `start()` and `read()`: unlike wall time,
    not inflated by other work on a busy host."""

    def __init__(self, pids: dict[str, int | None]) -> None:
        self.pids = pids
        self.started: dict[str, float | None] = {}

    def start(self) -> None:
        self.started = {name: cpu_seconds(pid) for name, pid in self.pids.items()}

    def read(self) -> dict[str, float | None]:
        out: dict[str, float | None] = {}
        for name, pid in self.pids.items():
            now, before = cpu_seconds(pid), self.started.get(name)
            out[name] = None if now is None or before is None else round(now - before, 2)
        return out


# -- measurements --------------------------------------------------------------------------


def percentiles(values: Sequence[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p90": None, "p99": None}
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return {"p50": round(float(p50), 2), "p90": round(float(p90), 2), "p99": round(float(p99), 2)}


def _engine_requests(workload: Sequence[BenchRequest], prefix: str) -> list[EngineRequest]:
    return [
        EngineRequest(
            f"{prefix}{i}", r.prompt_token_ids, SamplingParams(max_new_tokens=r.max_new_tokens)
        )
        for i, r in enumerate(workload)
    ]


def _wire_requests(workload: Sequence[BenchRequest], prefix: str) -> list[GenerateRequest]:
    return [
        GenerateRequest(
            id=f"{prefix}{i}", prompt_token_ids=r.prompt_token_ids, max_new_tokens=r.max_new_tokens
        )
        for i, r in enumerate(workload)
    ]


def direct_runs(
    engine: Engine,
    workload: Sequence[BenchRequest],
    short: Sequence[BenchRequest],
    o: PipelineOptions,
) -> dict[str, Any]:
    """Warm up; the workload in one continuous batch; then `short`, one request at a time."""
    out: dict[str, Any] = {}
    with torch.inference_mode():
        run_all(
            engine,
            _engine_requests([BenchRequest(workload[0].prompt_token_ids[:8], 4)] * 2, "warm-"),
        )
        if "throughput" in o.sections:
            start, cpu = time.perf_counter(), time.process_time()
            run = run_all(engine, _engine_requests(workload, "direct-"))
            wall, cpu = time.perf_counter() - start, time.process_time() - cpu
            out["throughput"] = {
                "requests": len(workload),
                "output_tokens": run.output_tokens,
                "wall_s": round(wall, 3),
                "output_tokens_per_s": round(run.output_tokens / wall, 2),
                "steps": len(run.steps),
                "cpu_s": {"this_process": round(cpu, 2)},
                "tokens": [c.token_ids for c in run.completions],
            }
        if "latency" in o.sections:
            times = []
            for request in _engine_requests(short, "direct-latency-"):
                start = time.perf_counter()
                run_all(engine, [request])
                times.append((time.perf_counter() - start) * 1e3)
            out["latency_ms"] = times
    return out


async def kafka_throughput(
    client: LoadClient,
    workload: Sequence[BenchRequest],
    direct: dict[str, Any],
    meter: CpuMeter,
    within_s: float,
) -> dict[str, Any]:
    requests = _wire_requests(workload, "kafka-")
    meter.start()
    start = await send_all(client, requests)
    arrived = await client.wait([r.id for r in requests], within_s)
    wall = max((t for t, _ in arrived.values()), default=start) - start
    results = [arrived[r.id][1] if r.id in arrived else None for r in requests]
    tokens = sum(len(r.token_ids) for r in results if r is not None and r.ok)
    return {
        "requests": len(requests),
        "results": len(arrived),
        "errors": sum(1 for r in results if r is not None and not r.ok),
        "output_tokens": tokens,
        "wall_s": round(wall, 3),
        "output_tokens_per_s": round(tokens / wall, 2) if wall > 0 else None,
        "cpu_s": meter.read(),
        # Greedy on both paths; batches differ, so float rounding may rarely part them.
        "outputs_matching_direct": sum(
            1 for r, d in zip(results, direct["tokens"], strict=True) if r and r.token_ids == d
        ),
    }


def light_rate(direct_ms: Sequence[float]) -> float:
    """A rate at which a request seldom meets another in the engine: one per two direct p90s,
    at most `MAX_LIGHT_RATE`. Faster, requests overlap, and batching (not Kafka) adds time."""
    p90_s = float(np.percentile(direct_ms, 90)) / 1e3
    return round(min(MAX_LIGHT_RATE, 0.5 / p90_s), 3)


async def kafka_latency(
    client: LoadClient, short: Sequence[BenchRequest], rate: float, within_s: float
) -> dict[str, Any]:
    """One request every 1/rate s; end to end = just before send → fetched by this client."""
    requests = _wire_requests(short, "latency-")
    sent_at: dict[str, float] = {}
    acks = []
    start = time.perf_counter()
    for i, request in enumerate(requests):
        await asyncio.sleep(max(0.0, start + i / rate - time.perf_counter()))
        sent_at[request.id] = time.perf_counter()
        acks.append(await client.send(request.id, _requests.encode(request)))
    await asyncio.gather(*acks)
    arrived = await client.wait(list(sent_at), within_s)
    ok = {i: res for i, (_, res) in arrived.items() if res.ok}
    e2e = {i: (arrived[i][0] - sent_at[i]) * 1e3 for i in ok}
    back = {i: client.result_leg_ms[i] for i in ok}
    return {
        "requests": len(requests),
        "results": len(arrived),
        "errors": len(arrived) - len(ok),
        "end_to_end_ms": percentiles(list(e2e.values())),
        # Its parts, per request: the way in (produce, fetch, decode, tokenize) and the
        # emitter's queue; the worker's own time; the way back (result sent → fetched here).
        "request_leg_ms": percentiles(
            [e2e[i] - r.timings.total_ms - back[i] for i, r in ok.items()]
        ),
        "result_leg_ms": percentiles(list(back.values())),
        # The worker's own view: consumed → result built (excludes Kafka in and out).
        "worker_total_ms": percentiles([r.timings.total_ms for r in ok.values()]),
        "worker_queued_ms": percentiles([r.timings.queued_ms for r in ok.values()]),
    }


async def ceiling_run(
    client: LoadClient, requests: Sequence[GenerateRequest], meter: CpuMeter, within_s: float
) -> dict[str, Any]:
    meter.start()
    start = await send_all(client, requests)
    sent = time.perf_counter() - start
    arrived = await client.wait([r.id for r in requests], within_s)
    wall = max((t for t, _ in arrived.values()), default=start) - start
    ok = sum(1 for _, res in arrived.values() if res.ok)
    cpu = meter.read()
    return {
        "requests": len(requests),
        "results": len(arrived),
        "errors": len(arrived) - ok,
        "wall_s": round(wall, 3),
        "requests_per_s": round(ok / wall, 1) if wall > 0 else None,
        # When the producer finishing is near wall_s, this process's producing was the limit.
        "all_sent_and_acked_s": round(sent, 3),
        "cpu_s": cpu,
        # CPU seconds per wall second: near 1.0, a single-threaded process was the limit.
        "cores_busy": {
            k: round(v / wall, 2) if v is not None and wall > 0 else None for k, v in cpu.items()
        },
    }


# -- the whole benchmark -------------------------------------------------------------------


@dataclass
class _Run:
    """What every section of one run shares."""

    options: PipelineOptions
    bootstrap: str
    broker_pid: int | None  # when this run started the broker
    run_id: str
    tmp: Path
    report: dict[str, Any]
    say: Progress
    topics_made: list[str] = field(default_factory=list)

    async def topics(self, kind: str) -> dict[str, str]:
        """A fresh requests/results/dlq trio per worker, so no worker reads another's requests."""
        base = f"tokenmill-bench-{self.run_id}-{kind}"
        names = {role: f"{base}.{role}" for role in ("requests", "results", "dlq")}
        await create_topics(
            self.bootstrap, requests_partitions=self.options.partitions, names=names
        )
        self.topics_made += names.values()
        return names

    def meter(self, worker: asyncio.subprocess.Process) -> CpuMeter:
        return CpuMeter({"worker": worker.pid, "client": os.getpid(), "broker": self.broker_pid})


@contextlib.asynccontextmanager
async def broker(
    bootstrap: str | None, state_dir: Path, say: Progress
) -> AsyncIterator[tuple[str, int | None]]:
    """The given broker, or a local one on free ports in `state_dir`, stopped on the way out.

    Yields its bootstrap address and, when started here, its pid.
    """
    if bootstrap is not None:
        yield bootstrap, None
        return
    kafka = LocalKafka(state_dir=state_dir, port=free_port())
    say(f"kafka: starting a local broker on {kafka.bootstrap}")
    await asyncio.to_thread(kafka.start)
    try:
        yield kafka.bootstrap, kafka.pid
    finally:
        await asyncio.to_thread(kafka.stop)


async def _delete_topics(bootstrap: str, names: Sequence[str]) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    with contextlib.suppress(Exception):  # best effort: a broker we do not own keeps them
        await admin.start()
        await admin.delete_topics(list(names))
    await admin.close()


async def _model_sections(run: _Run) -> None:
    """Throughput and latency: the direct engine first (then released), then the worker."""
    o, report, say = run.options, run.report, run.say
    say(f"loading {o.engine.model}")
    # The direct engine runs on this thread: nothing else is on the event loop until it is done.
    engine = build_engine(o.engine)
    workload = make_workload(engine, o.workload)
    short_spec = BenchOptions(**{**asdict(o.workload), "requests": o.latency_requests})
    short = [
        BenchRequest(r.prompt_token_ids, o.latency_max_new_tokens)
        for r in make_workload(engine, short_spec)
    ]
    m = engine.model
    report["model"] = {"name": m.name, "digest": m.digest, "arch": m.config.arch}
    report["environment"] |= {"device": str(m.device), "dtype": str(m.dtype).removeprefix("torch.")}
    say(f"direct engine: {len(workload)} requests at once, then {len(short)} one at a time")
    load = [host_load()]
    direct = direct_runs(engine, workload, short, o)
    del engine, m
    gc.collect()

    topics = await run.topics("torch")
    log = run.tmp / "worker-torch.log"
    argv = worker_argv(o.engine, "torch", run.bootstrap, topics)
    report["worker"]["argv"]["torch"] = argv[3:]
    warm = _wire_requests([BenchRequest(workload[0].prompt_token_ids[:8], 4)] * 2, "warm-")
    async with (
        worker_process(argv, log) as proc,
        LoadClient(run.bootstrap, topics, linger_ms=0) as client,
    ):
        say("worker (torch): starting and warming up")
        report["worker"]["warm_up_s"]["torch"] = await warm_up(client, proc, log, warm, o.timeout_s)
        if "throughput" in o.sections:
            say(f"kafka: {len(workload)} requests at once")
            d = direct["throughput"]
            k = await kafka_throughput(client, workload, d, run.meter(proc), o.timeout_s)
            rate, direct_rate = k["output_tokens_per_s"], d["output_tokens_per_s"]
            report["throughput"] = {
                "direct": {key: v for key, v in d.items() if key != "tokens"},
                "kafka": k,
                "ratio": round(rate / direct_rate, 3) if rate and direct_rate else None,
                "host_load_1m": [*load, host_load()],
            }
        if "latency" in o.sections:
            rate = o.rate or light_rate(direct["latency_ms"])
            say(f"kafka: {len(short)} requests at {rate}/s")
            k = await kafka_latency(client, short, rate, o.timeout_s)
            d = percentiles(direct["latency_ms"])
            e2e = k["end_to_end_ms"]
            report["latency"] = {
                "rate_per_s": rate,
                "rate_chosen": "given" if o.rate else "auto: min(2, 0.5 / direct p90 s)",
                # Near or above 1, requests overlap in the engine: the added ms include batching.
                "offered_load": round(rate * float(np.mean(direct["latency_ms"])) / 1e3, 2),
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
    report["worker"]["exit_code"]["torch"] = proc.returncode


async def _ceiling_section(run: _Run) -> None:
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
    argv = worker_argv(o.engine, "echo", run.bootstrap, topics)
    report["worker"]["argv"]["echo"] = argv[3:]
    light = [BenchRequest(ids, p) for ids in prompts[: o.latency_requests]]
    rate = o.rate or MAX_LIGHT_RATE
    async with (
        worker_process(argv, log) as proc,
        LoadClient(run.bootstrap, topics, linger_ms=5) as client,
    ):
        say("worker (echo): starting and warming up")
        report["worker"]["warm_up_s"]["echo"] = await warm_up(client, proc, log, warm, o.timeout_s)
        load = [host_load()]
        say(f"kafka: {len(light)} echo requests at {rate}/s")
        async with LoadClient(run.bootstrap, topics, linger_ms=0) as one_by_one:
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


def _skeleton(o: PipelineOptions, run_id: str) -> dict[str, Any]:
    w = o.workload
    defaults = WorkerConfig()
    skipped = {"skipped": "not selected (--only)"}
    return {
        "benchmark": "pipeline",
        "run_id": run_id,
        "model": None,
        "environment": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "aiokafka": aiokafka.__version__,
            "cpu_count": os.cpu_count(),
            "cpus_usable": len(os.sched_getaffinity(0)),
            "torch_threads": torch.get_num_threads(),
            "host_load_1m_at_start": host_load(),
        },
        "kafka": {
            "broker": "given" if o.bootstrap_servers else "started for this run, on this machine",
            "bootstrap": o.bootstrap_servers,
            "partitions": o.partitions,
            "client": "aiokafka, acks=all, idempotent; linger 0 ms, 5 ms for the ceiling's floods",
        },
        "worker": {
            "mode": WORKER_MODE,
            "engine_options": asdict(o.engine.engine),
            "settings": {
                "max_wait_ms": defaults.max_wait_ms,
                "max_batch_size": defaults.max_batch_size,
                "max_batch_tokens": defaults.max_batch_tokens,
                "fetch_max_records": defaults.fetch_max_records,
                "emit_linger_ms": defaults.linger_ms,
                "high_watermark_requests": defaults.watermarks.high_requests,
            },
            "argv": {},
            "warm_up_s": {},
            "exit_code": {},
        },
        "workload": {
            "seed": w.seed,
            "requests": w.requests,
            "prompt_len_range": [w.min_prompt, w.max_prompt],
            "output_len_range": [w.min_output, w.max_output],
            "prompts": "uniform random token ids (bench engine's), sent as prompt_token_ids",
            "sampling": "greedy; EOS honoured on both paths (the wire has no ignore_eos)",
        },
        "sections": list(o.sections),
        "throughput": skipped,
        "latency": skipped,
        "ceiling": skipped,
        "warnings": [],
    }


async def run_bench(options: PipelineOptions, progress: Progress | None = None) -> dict[str, Any]:
    """Run the chosen sections; a JSON-ready report (see `ops/cmd_bench.py`)."""
    o = options
    run_id = uuid.uuid4().hex[:8]
    report = _skeleton(o, run_id)
    with tempfile.TemporaryDirectory(prefix="tokenmill-bench-") as tmp:
        say = progress or (lambda _: None)
        async with broker(o.bootstrap_servers, Path(tmp) / "kafka", say) as (bootstrap, pid):
            report["kafka"]["bootstrap"] = bootstrap
            run = _Run(o, bootstrap, pid, run_id, Path(tmp), report, say)
            try:
                if {"throughput", "latency"} & set(o.sections):
                    await _model_sections(run)
                if "ceiling" in o.sections:
                    await _ceiling_section(run)
            finally:
                if o.bootstrap_servers is not None and run.topics_made:
                    await _delete_topics(bootstrap, run.topics_made)
    report["environment"]["host_load_1m_at_end"] = host_load()
    report["targets"] = _targets(report)
    report["warnings"] = _warnings(report)
    return report


def _target(value: float | None, target: float, *, at_most: bool = False) -> dict[str, Any]:
    met = None if value is None else (value <= target if at_most else value >= target)
    return {
        "target": target,
        "at_most" if at_most else "at_least": True,
        "value": value,
        "met": met,
    }


def _targets(report: dict[str, Any]) -> dict[str, Any]:
    ceiling = report["ceiling"]
    return {
        "throughput_ratio_vs_direct": _target(
            report["throughput"].get("ratio"), TARGET_THROUGHPUT_RATIO
        ),
        "latency_added_p50_ms": _target(
            report["latency"].get("added_ms", {}).get("p50"), TARGET_ADDED_P50_MS, at_most=True
        ),
        # Set for 2 cores with the broker on the same machine (see environment for this one's).
        "ceiling_requests_per_s": _target(
            ceiling.get("prompt_token_ids", {}).get("requests_per_s"), TARGET_CEILING_RPS
        ),
        "ceiling_text_requests_per_s": _target(
            ceiling.get("text_prompts", {}).get("requests_per_s"), TARGET_CEILING_RPS
        ),
    }


def _warnings(report: dict[str, Any]) -> list[str]:
    env = report["environment"]
    cpus = env["cpus_usable"]
    loads = [env["host_load_1m_at_start"], env["host_load_1m_at_end"]]
    for section in SECTIONS:
        loads += report[section].get("host_load_1m", [])
    if any(x is not None and x > cpus for x in loads):
        return [
            f"the host's 1-minute load average passed its {cpus} CPUs: other work competed for "
            "them, so wall-clock figures are noisy (cpu_s figures much less so)"
        ]
    return []
