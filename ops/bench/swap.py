"""The swap benchmark: one zero-downtime model swap under steady open-loop load.

One `tokenmill worker` subprocess serves `a.gguf` from a models directory in a temp dir that
also holds `b.gguf`: two hard links (copies across filesystems) to the chosen GGUF file. A real
broker (a local one on free ports unless a connection is given) carries topics named
for this run. Requests go out at a fixed rate, open loop (sends are scheduled, never wait for
answers); at `swap_at` of the run a signed `SwapModel("b.gguf")` goes out on the control topic.

Each request falls in a window by its send time: `before` the command, `during` (until the
worker's `model_swapped` event) and `after`. Per window: latency (send → result fetched here)
p50/p99/max, throughput (results/s arriving within the window's span) and the models that
answered. Then requests lost, duplicates, errors by code, p99 during / p99 before, and the
throughput dip: the slowest 1-s bin from the command to 2 s past the swap, over the before
window's mean. Windows and bins use unix times (the worker's `at` is one: same host); latency
uses this process's monotonic clock. CPU seconds of the worker, this client, the broker and
every other process on the host over the load are reported beside them: on a shared machine
the others' work is what makes wall-clock figures noisy.

`b` is a real second load (another path, named "b" in results) of the same bytes, so both
models have the same digest. With `drain` the worker gets a 1-byte swap memory budget: the
two models cannot both fit, which forces a drain-mode swap (stop admitting, finish, unload,
load, resume) instead of a flip.

`run_swap_bench(options)` returns one JSON-ready dict; it never asserts.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer

from actors.kafka.connection import KafkaConnection
from messages.codec import Codec
from messages.control import Command, Status, SwapModel
from messages.events import Event, ModelSwapFailed, ModelSwapped, StatusReply
from messages.request import GenerateRequest
from messages.result import GenerateResult
from ops.bench.broker import broker, delete_topics, kafka_facts
from ops.bench.narrate import Narrate
from ops.bench.swap_report import summarize, warnings_for
from ops.bench.swap_run import ResultLog, Stamp, SwapRun
from ops.bench.worker import CpuMeter, log_tail, worker_command, worker_process
from ops.bench.workload import host_load
from ops.control.client import send_command
from ops.models.registry import resolve_model
from ops.services.topics import create_topics

ROLES = ("requests", "results", "dlq", "control", "events")
_requests = Codec(GenerateRequest)
_results = Codec(GenerateResult)


@dataclass(frozen=True)
class SwapBenchOptions:
    model: str = "smollm2-135m"  # an alias or a .gguf file: both a and b are links to it
    # requests/s. At 3/s (16 new tokens) SmolLM2 on 2 CPUs already kept both cores ~85% busy
    # before the swap, leaving the swap's load no room: 1.5 leaves about half of them to it.
    rate: float = 1.5
    duration_s: float = 45.0  # of the steady load
    swap_at: float = 0.4  # share of duration_s at which the swap command goes out
    max_new_tokens: int = 16
    drain: bool = False  # force a drain-mode swap
    kafka: KafkaConnection | None = None  # None: start a broker for this run
    timeout_s: float = 120.0  # per wait: the worker's start, the swap, the last results
    # Keep sending past duration_s, at the same rate, until this many requests went out after
    # the swap was done (within timeout_s more): a slow swap still leaves an "after" window.
    min_after: int = 0

    def __post_init__(self) -> None:
        if min(self.rate, self.duration_s, self.timeout_s) <= 0 or self.max_new_tokens < 1:
            raise ValueError("rate, duration, timeout and max_new_tokens must be positive")
        if not 0 < self.swap_at < 1:
            raise ValueError("swap_at must lie between 0 and 1 (a share of the duration)")

    @property
    def requests(self) -> int:
        return max(1, round(self.rate * self.duration_s))


# -- the run -------------------------------------------------------------------------------


def link_models(source: Path, models_dir: Path) -> str:
    """`a.gguf` and `b.gguf` in `models_dir`, hard links to `source` (else copies)."""
    models_dir.mkdir(parents=True, exist_ok=True)
    how = "hard links"
    for name in ("a.gguf", "b.gguf"):
        try:
            os.link(source, models_dir / name)
        except OSError:  # another filesystem, or links not allowed
            shutil.copyfile(source, models_dir / name)
            how = "copies"
    return how


@dataclass(frozen=True)
class Rig:
    """This run's broker, topics (by role) and control secret."""

    kafka: KafkaConnection
    broker_pid: int | None  # when this run started the broker
    topics: dict[str, str]
    secret: str

    async def command(
        self, command: Command, answered: tuple[type, ...], wait_s: float
    ) -> list[Event]:
        """Send a signed command; its events, once one is of an `answered` type (or `wait_s`)."""
        return await send_command(
            self.kafka,
            command,
            secret=self.secret,
            control_topic=self.topics["control"],
            events_topic=self.topics["events"],
            wait_s=wait_s,
            until=lambda events: any(isinstance(e, answered) for e in events),
        )


def swap_worker_argv(models_dir: Path, rig: Rig, drain: bool) -> tuple[list[str], dict[str, str]]:
    """The worker under test: a models dir to swap within, the control lane, no HTTP; and the
    env vars holding the connection's secrets."""
    flags = {
        "--model": models_dir / "a.gguf",
        "--models-dir": models_dir,
        "--group": f"{rig.topics['requests']}.workers",
        "--requests-topic": rig.topics["requests"],
        "--results-topic": rig.topics["results"],
        "--dlq-topic": rig.topics["dlq"],
        "--control-topic": rig.topics["control"],
        "--events-topic": rig.topics["events"],
        "--control-secret": rig.secret,
        "--worker-id": "bench-swap",
        "--http-port": -1,
        "--swap-memory-budget": 1 if drain else None,  # no room for two models: drain mode
    }
    return worker_command(flags, rig.kafka)


async def _until_ready(
    rig: Rig,
    results: ResultLog,
    producer: AIOKafkaProducer,
    proc: asyncio.subprocess.Process,
    log: Path,
    o: SwapBenchOptions,
) -> float:
    """A warm-up request answered (model loaded, group joined), then a status reply (the
    control consumer is reading). Seconds it took; RuntimeError if the worker exits or stalls."""
    start = time.monotonic()
    warm = _load_request("warm-0", 0, o)
    await producer.send_and_wait(rig.topics["requests"], _requests.encode(warm), key=b"warm-0")
    waiting = asyncio.ensure_future(results.missing([warm.id], o.timeout_s))
    exited = asyncio.ensure_future(proc.wait())
    await asyncio.wait({waiting, exited}, return_when=asyncio.FIRST_COMPLETED)
    exited.cancel()
    if not waiting.done() or waiting.result():
        waiting.cancel()
        raise RuntimeError(f"the worker did not answer its warm-up request:\n{log_tail(log)}")
    # A command sent before the control consumer has its positions is never seen: ask again.
    while time.monotonic() - start < o.timeout_s and proc.returncode is None:
        if await rig.command(Status(), (StatusReply,), 3.0):
            return round(time.monotonic() - start, 2)
    raise RuntimeError(f"the worker never answered a status command:\n{log_tail(log)}")


async def _steady_load(
    producer: AIOKafkaProducer, topic: str, o: SwapBenchOptions, run: SwapRun
) -> None:
    """Send at `o.rate` for `o.duration_s` (and on, see `min_after`), each at its scheduled
    time; wait for the acks."""
    acks = []
    start = time.monotonic()
    i = 0
    while i < o.requests or _more_after(o, run, start):
        request_id = f"load-{i}"
        value = _requests.encode(_load_request(request_id, i, o))
        due = start + i / o.rate
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        run.sent[request_id] = stamp = Stamp.now()
        run.late_ms.append((stamp.mono - due) * 1e3)
        acks.append(await producer.send(topic, value=value, key=request_id.encode()))
        i += 1
    await asyncio.gather(*acks)
    stamps = list(run.sent.values())
    run.load_span = (stamps[0].unix, stamps[-1].unix)


def _more_after(o: SwapBenchOptions, run: SwapRun, start: float) -> bool:
    """Whether to send on past the planned requests: fewer than `min_after` went out after
    the swap was done, and the swap has not failed nor the extra time run out."""
    if o.min_after <= 0 or time.monotonic() > start + o.duration_s + o.timeout_s:
        return False
    done = next((e for e in run.events if isinstance(e, ModelSwapped | ModelSwapFailed)), None)
    if isinstance(done, ModelSwapFailed):
        return False
    if done is None:
        return True
    return sum(stamp.unix > done.at for stamp in run.sent.values()) < o.min_after


def _load_request(request_id: str, i: int, o: SwapBenchOptions) -> GenerateRequest:
    prompt = f"Write one sentence about the number {i}."
    return GenerateRequest(id=request_id, prompt=prompt, max_new_tokens=o.max_new_tokens)


async def _swap_later(rig: Rig, o: SwapBenchOptions, run: SwapRun) -> None:
    await asyncio.sleep(o.swap_at * o.duration_s)
    run.command_at = time.time()
    answered = (ModelSwapped, ModelSwapFailed)
    run.events = await rig.command(SwapModel(model="b.gguf"), answered, o.timeout_s)


async def run_swap_bench(o: SwapBenchOptions, progress: Narrate | None = None) -> dict[str, Any]:
    """Run the load and the swap; a JSON-ready report (see `ops/bench/cli.py`)."""
    say = progress or (lambda _: None)
    run_id = uuid.uuid4().hex[:8]
    source = resolve_model(o.model)
    load_at_start = host_load()
    with tempfile.TemporaryDirectory(prefix="tokenmill-bench-swap-") as tmp:
        models_dir = Path(tmp) / "models"
        linked = link_models(source, models_dir)
        async with broker(o.kafka, Path(tmp) / "kafka", say) as (kafka, pid):
            topics = {role: f"tokenmill-bench-{run_id}-swap.{role}" for role in ROLES}
            await create_topics(kafka, requests_partitions=3, names=topics)
            rig = Rig(kafka, pid, topics, secrets.token_hex(16))
            try:
                report = await _measure(o, rig, models_dir, say)
            finally:
                if o.kafka is not None:
                    await delete_topics(kafka, list(topics.values()))
    report["config"] = {
        "model": o.model,
        "model_file": str(source),
        "mode": "drain" if o.drain else "flip",
        "rate_per_s": o.rate,
        "duration_s": o.duration_s,
        "swap_at": o.swap_at,
        "requests": report.pop("requests_sent"),
        "planned_requests": o.requests,
        "min_after": o.min_after,
        "max_new_tokens": o.max_new_tokens,
        "prompts": "text, 'Write one sentence about the number {i}.'; greedy",
    }
    report["models"] = {
        "linked_as": linked,
        "note": "a.gguf and b.gguf are links to the same file: b is a real second load (another "
        "path, named b in results) of the same bytes, so both digests are equal",
    }
    report["kafka"] = kafka_facts(o.kafka is not None, rig.kafka) | {"requests_partitions": 3}
    report["environment"] = {
        "python": sys.version.split()[0],
        "cpus_usable": len(os.sched_getaffinity(0)),
        "host_load_1m": [load_at_start, host_load()],
    }
    report["warnings"] = warnings_for(report)
    return report


async def _measure(o: SwapBenchOptions, rig: Rig, models_dir: Path, say: Narrate) -> dict[str, Any]:
    argv, connection_secrets = swap_worker_argv(models_dir, rig, o.drain)
    log = models_dir.parent / "worker.log"
    run = SwapRun()
    producer = AIOKafkaProducer(
        **rig.kafka.producer_kwargs(), acks="all", enable_idempotence=True, linger_ms=0
    )
    await producer.start()
    try:
        partitions = await producer.partitions_for(rig.topics["results"])
        async with (
            worker_process(argv, log, env=connection_secrets) as proc,
            ResultLog(rig.kafka, rig.topics["results"], partitions) as results,
        ):
            say("worker: loading a.gguf, then a warm-up request and a status command")
            ready_s = await _until_ready(rig, results, producer, proc, log, o)
            say(f"load: {o.rate}/s for {o.duration_s} s; swap to b.gguf at {o.swap_at:.0%}")
            meter = CpuMeter({"worker": proc.pid, "client": os.getpid(), "broker": rig.broker_pid})
            meter.start()
            host = host_busy_s()
            async with asyncio.TaskGroup() as tg:
                tg.create_task(_steady_load(producer, rig.topics["requests"], o, run))
                tg.create_task(_swap_later(rig, o, run))
            say("load: sent; waiting for the last results")
            await results.missing(run.sent.keys(), o.timeout_s)
            cpu = cpu_use(meter, host, time.time() - run.load_span[0])
        exit_code = proc.returncode
    finally:
        await producer.stop()
    shown = argv[3:]
    shown[shown.index("--control-secret") + 1] = "<random, for this run>"
    worker = {"argv": shown, "ready_s": ready_s, "exit_code": exit_code}
    return summarize(run, results) | {
        "cpu_s": cpu,
        "worker": worker,
        "requests_sent": len(run.sent),
    }


def host_busy_s() -> float | None:
    """CPU seconds all of this host's CPUs have been busy since boot (/proc/stat)."""
    try:
        user, nice, system, _idle, _iowait, irq, softirq = map(
            int, Path("/proc/stat").read_text().split()[1:8]
        )
    except (OSError, ValueError):
        return None
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def cpu_use(meter: CpuMeter, host_before: float | None, wall_s: float) -> dict[str, Any]:
    """CPU seconds of the worker, this client and the broker over the load and its tail, and of
    everything else on the host: the others compete for the same CPUs."""
    ours = meter.read()
    host_now = host_busy_s()
    host = None if host_now is None or host_before is None else host_now - host_before
    known = [v for v in ours.values() if v is not None]
    # The host's counter and each process's are read moments apart: a quiet host can come out
    # a little below zero.
    others = round(max(0.0, host - sum(known)), 2) if host is not None else None
    return {**ours, "other_processes": others, "wall_s": round(wall_s, 2)}


# -- the report ----------------------------------------------------------------------------
