"""`bench startup`: how long a process takes to be useful, from a cold interpreter each time.

Each round measures, in this order, on fresh processes:
- `probe`: `python -m ops.bench.startup_probe MODEL`, its phases from inside (imports, the
  loader's checkpoint, build, weights, kernels and digest, the engine, one token) and the
  process's wall time from outside (the interpreter's own start included);
- `generate`: `tokenmill generate --max-new-tokens 1`, wall time;
- `worker`: `tokenmill worker` on a broker started for the run (or the one given) until its
  `/readyz` answers 200, and the load time it logs (`model_loaded`).
Reported: every round and the medians; targets: a worker ready and a one-token generate in at
most 5 s each (the model's file in the cache and the page cache warm: the first round is the
coldest, and says so)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from actors.kafka.connection import KafkaConnection
from gpu.engine_config import EngineConfig
from ops.bench.report import Narrate, Report, quiet
from ops.bench.rig import Rig, child_env, log_tail, rig, worker_argv, worker_process
from ops.models.engine_options import EngineChoice
from ops.models.registry import resolve_model
from ops.services.local_process import free_port

READY_TARGET_S = 5.0
GENERATE_TARGET_S = 5.0
CLI = [sys.executable, "-c", "from ops.cli import main; main()"]


@dataclass(frozen=True)
class StartupOptions:
    model: str = "smollm2-135m"
    rounds: int = 3
    kafka: KafkaConnection | None = None  # None: start a broker for this run
    timeout_s: float = 120.0  # per process

    def __post_init__(self) -> None:
        if self.rounds < 1 or self.timeout_s <= 0:
            raise ValueError("rounds and timeout must be positive")


async def run_startup_bench(o: StartupOptions, say: Narrate = quiet) -> Report:
    resolve_model(o.model)  # fetched before anything is timed
    report = Report("startup")
    rounds: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="tokenmill-bench-startup-") as tmp:
        async with rig(o.kafka, Path(tmp), say, partitions=1) as r:
            report["kafka"] = r.facts()
            for i in range(o.rounds):
                say(f"round {i + 1}: probe, generate, worker")
                probe = await _probe(o)
                _, generate_s = await _timed([*CLI, "generate", "-m", o.model, "-p", "Hello",
                                              "--max-new-tokens", "1"], o)  # fmt: skip
                rounds.append({"probe": probe, "generate_s": generate_s,
                               "worker": await _worker(r, o, i)})  # fmt: skip
    report["model"] = o.model
    report["rounds"] = rounds
    medians = _medians(rounds)
    report["medians"] = medians
    report.headline("worker ready", f"{medians['worker_ready_s']} s (median)")
    report.headline("generate, 1 token", f"{medians['generate_s']} s (median)")
    report.headline("phases (median s)", medians["probe"])
    report.target("worker_ready_s", medians["worker_ready_s"], READY_TARGET_S, at_most=True)
    report.target("generate_s", medians["generate_s"], GENERATE_TARGET_S, at_most=True)
    return report.finish()


async def _probe(o: StartupOptions) -> dict[str, float]:
    out, wall = await _timed([sys.executable, "-m", "ops.bench.startup_probe", o.model], o)
    phases: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    # What the probe could not see from inside: the interpreter's start, and its exit.
    phases["interpreter"] = round(wall - phases["total"], 3)
    phases["process_wall"] = round(wall, 3)
    return phases


async def _timed(argv: list[str], o: StartupOptions) -> tuple[str, float]:
    """Run `argv` to its end: its stdout and wall seconds. RuntimeError with its stderr's tail
    if it fails, or if it runs past `o.timeout_s` (then it is killed, not left running)."""
    start = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=child_env()
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), o.timeout_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise RuntimeError(f"{argv[2:]} ran past {o.timeout_s} s") from None
    if proc.returncode:
        raise RuntimeError(f"{argv[2:]} failed:\n{err.decode(errors='replace')[-2000:]}")
    return out.decode(errors="replace"), round(time.perf_counter() - start, 3)


async def _worker(r: Rig, o: StartupOptions, i: int) -> dict[str, Any]:
    """Spawn to `/readyz` 200, and the load time the worker logged."""
    topics = await r.topics(f"startup-{i}", ("requests", "results", "dlq"))
    port = free_port()
    choice = EngineChoice(o.model, None, None, EngineConfig())
    argv, secrets = worker_argv(choice, "torch", r.kafka, topics, http_port=port)
    log = r.tmp / f"worker-startup-{i}.log"
    start = time.perf_counter()
    async with worker_process(argv, log, env=secrets) as proc:
        deadline = start + o.timeout_s
        while not await asyncio.to_thread(_ready, port):
            if proc.returncode is not None or time.perf_counter() > deadline:
                raise RuntimeError(f"the worker never became ready:\n{log_tail(log)}")
            await asyncio.sleep(0.05)  # a poll: readiness has no event to wait on from here
        ready_s = round(time.perf_counter() - start, 3)
    loaded = _logged(log, "model_loaded")
    return {"ready_s": ready_s, "model_loaded_s": loaded.get("seconds"),
            "load_phases": loaded.get("phases")}  # fmt: skip


def _ready(port: int) -> bool:
    url = f"http://127.0.0.1:{port}/readyz"
    with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=1) as answer:
        return bool(answer.status == 200)
    return False  # not listening yet, or 503


def _logged(log: Path, event: str) -> dict[str, Any]:
    """The first JSON line of `log` with this `event` ({} if none)."""
    for line in log.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if isinstance(record, dict) and record.get("event") == event:
                return record
    return {}


def _medians(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    phases = rounds[0]["probe"].keys()
    return {
        "probe": {p: round(statistics.median(x["probe"][p] for x in rounds), 3) for p in phases},
        "generate_s": round(statistics.median(x["generate_s"] for x in rounds), 3),
        "worker_ready_s": round(statistics.median(x["worker"]["ready_s"] for x in rounds), 3),
    }
