"""The batch benchmark: what `tokenmill batch run` costs over raw Kafka clients, and its memory.

On one real broker (a local one on free ports unless a connection is given) and topics
named for this run, one `tokenmill worker --engine echo` subprocess (no model: the plumbing
alone) answers, in turn:

- baseline: the same requests (`prompt_token_ids`, 2 new tokens) produced as fast as this
  process's raw aiokafka producer takes them, results collected by id (`bench pipeline`'s
  ceiling client): requests/s from the first send to the last result.
- batch: the same requests as OpenAI Batch lines through `tokenmill batch run` subprocesses,
  once for the full file and once for a tenth of it: requests/s and the client's peak RSS
  (VmHWM), both from the run's own summary, and its CPU seconds (from `wait4`).

Reports the ratio of the batch client's rate to the baseline's and how much the peak RSS grows
from the small file to the large one; never asserts.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from actors.kafka.connection import KafkaConnection
from messages.request import GenerateRequest
from ops.bench.broker import broker, kafka_facts
from ops.bench.kafka import LoadClient, ceiling_run, warm_up
from ops.bench.narrate import Narrate
from ops.bench.worker import CpuMeter, child_env, worker_argv, worker_process
from ops.bench.workload import host_load
from ops.connection.options import connection_argv
from ops.models.engine_options import EngineChoice
from ops.services.topics import create_topics


@dataclass(frozen=True)
class BatchBenchOptions:
    engine: EngineChoice  # the echo worker reads this model's config and tokenizer
    lines: int = 100_000
    max_inflight: int = 1024
    kafka: KafkaConnection | None = None  # None: start a broker for this run
    partitions: int = 6
    timeout_s: float = 1800.0


@dataclass(frozen=True)
class Measured:
    """One subprocess run to its end: exit code, output, its own CPU seconds."""

    returncode: int
    stdout: str
    stderr: str
    cpu_s: float
    wall_s: float


def run_measured(
    argv: list[str], cwd: Path | None = None, env: dict[str, str] | None = None
) -> Measured:
    """Run `argv` to the end, reaping it with wait4 so its own CPU time is what is measured."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        child = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=err, env=env)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - start
        child.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return Measured(
            returncode=child.returncode,
            stdout=out.read().decode(errors="replace"),
            stderr=err.read().decode(errors="replace"),
            cpu_s=round(usage.ru_utime + usage.ru_stime, 2),
            wall_s=round(wall, 2),
        )


def prompt_ids(i: int) -> list[int]:
    return [100 + i % 50, 7, 8, 9]


def write_batch_file(path: Path, lines: int, model: str) -> Path:
    """`lines` completions with short token-id prompts, 2 new tokens each."""
    with path.open("w") as f:
        for i in range(lines):
            body = {"model": model, "prompt": prompt_ids(i), "max_tokens": 2}
            line = {"custom_id": f"line-{i}", "method": "POST", "url": "/v1/completions"}
            f.write(json.dumps({**line, "body": body}) + "\n")
    return path


async def run_batch_bench(options: BatchBenchOptions, say: Narrate) -> dict[str, Any]:
    o = options
    run_id = uuid.uuid4().hex[:8]
    report: dict[str, Any] = {
        "benchmark": "batch",
        "run_id": run_id,
        "lines": o.lines,
        "small_lines": max(o.lines // 10, 1),
        "max_inflight": o.max_inflight,
        "engine": "echo (no model; each result is its prompt's tokens)",
        "host_load_1m": [host_load()],
    }
    with tempfile.TemporaryDirectory(prefix="tokenmill-bench-batch-") as tmp_name:
        tmp = Path(tmp_name)
        async with broker(o.kafka, tmp / "kafka", say) as (kafka, broker_pid):
            report["kafka"] = kafka_facts(o.kafka is not None, kafka) | {"partitions": o.partitions}
            base = f"tokenmill-bench-{run_id}-batch"
            topics = {role: f"{base}.{role}" for role in ("requests", "results", "dlq")}
            await create_topics(kafka, requests_partitions=o.partitions, names=topics)
            argv, secrets = worker_argv(o.engine, "echo", kafka, topics)
            log = tmp / "worker.log"
            async with (
                worker_process(argv, log, env=secrets) as proc,
                LoadClient(kafka, topics, linger_ms=5) as client,
            ):
                say("worker (echo): starting and warming up")
                warm = [_request(f"warm-{i}", i) for i in range(2000)]
                report["warm_up_s"] = await warm_up(client, proc, log, warm, o.timeout_s)
                say(f"baseline: {o.lines} requests from a raw aiokafka client")
                meter = CpuMeter({"worker": proc.pid, "client": os.getpid(), "broker": broker_pid})
                requests = [_request(f"raw-{i}", i) for i in range(o.lines)]
                report["baseline"] = await ceiling_run(client, requests, meter, o.timeout_s)
                del requests
                report["batch"] = {}
                for lines in (report["small_lines"], o.lines):
                    say(f"batch: {lines} lines through `tokenmill batch run`")
                    report["batch"][str(lines)] = await asyncio.to_thread(
                        _batch_run, o, kafka, topics, tmp, lines
                    )
            report["worker_exit_code"] = proc.returncode
    report["host_load_1m"].append(host_load())
    report["results"] = _results(report)
    return report


def _request(request_id: str, i: int) -> GenerateRequest:
    return GenerateRequest(id=request_id, prompt_token_ids=prompt_ids(i), max_new_tokens=2)


def _batch_run(
    o: BatchBenchOptions, kafka: KafkaConnection, topics: dict[str, str], tmp: Path, lines: int
) -> dict[str, Any]:
    source = write_batch_file(tmp / f"in-{lines}.jsonl", lines, o.engine.model)
    connection, secrets = connection_argv(kafka)
    argv = [
        sys.executable, "-m", "ops", "batch", "run", str(source),
        "-o", str(tmp / f"out-{lines}.jsonl"), "--json", "--no-progress",
        *connection, "--max-inflight", str(o.max_inflight),
        "--topic", topics["requests"], "--results-topic", topics["results"],
        "--stall-timeout", str(o.timeout_s),
    ]  # fmt: skip
    measured = run_measured(
        argv, cwd=Path(__file__).resolve().parent.parent, env=child_env(secrets)
    )
    if measured.returncode != 0:
        raise RuntimeError(f"tokenmill batch run failed:\n{measured.stderr[-3000:]}")
    summary = json.loads(measured.stdout)
    return {
        "complete": summary["complete"],
        "ok": summary["ok"],
        "wall_s": summary["wall_s"],
        "requests_per_s": summary["requests_per_s"],
        "process_wall_s": measured.wall_s,  # with interpreter start-up and reading the file
        "peak_rss_mb": summary["peak_rss_mb"],
        "cpu_s": measured.cpu_s,
    }


def _results(report: dict[str, Any]) -> dict[str, Any]:
    raw = report["baseline"]["requests_per_s"]
    small = report["batch"][str(report["small_lines"])]
    large = report["batch"][str(report["lines"])]
    return {
        "baseline_requests_per_s": raw,
        "batch_requests_per_s": large["requests_per_s"],
        "batch_vs_raw_client": round(large["requests_per_s"] / raw, 3) if raw else None,
        "peak_rss_mb": {"small": small["peak_rss_mb"], "large": large["peak_rss_mb"]},
        "peak_rss_growth_mb": round(large["peak_rss_mb"] - small["peak_rss_mb"], 1),
        "client_cpu_us_per_line": round(large["cpu_s"] / report["lines"] * 1e6, 1),
    }
