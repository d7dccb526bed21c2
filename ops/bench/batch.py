"""`bench batch`: `tokenmill batch run` against a raw Kafka client on one echo worker, and the
batch client's peak RSS as its file grows (`tokenmill bench batch --help`)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from actors.kafka.connection import KafkaConnection
from messages.request import GenerateRequest
from ops.bench.load import flood, worker
from ops.bench.report import Narrate, Report, quiet, ratio
from ops.bench.rig import Rig, child_env, rig
from ops.connection.options import connection_argv
from ops.models.engine_options import EngineChoice


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


def _request(request_id: str, i: int) -> GenerateRequest:
    return GenerateRequest(
        id=request_id, prompt_token_ids=[100 + i % 50, 7, 8, 9], max_new_tokens=2
    )


async def run_batch_bench(o: BatchBenchOptions, say: Narrate = quiet) -> Report:
    report = Report("batch")
    small = max(o.lines // 10, 1)
    report |= {
        "lines": o.lines,
        "small_lines": small,
        "max_inflight": o.max_inflight,
        "engine": "echo (no model; each result is its prompt's tokens)",
    }
    with tempfile.TemporaryDirectory(prefix="tokenmill-bench-batch-") as tmp:
        async with rig(o.kafka, Path(tmp), say, o.partitions) as r:
            report["kafka"] = r.facts()
            say("worker (echo): starting and warming up")
            warm = [_request(f"warm-{i}", i) for i in range(min(2000, o.lines))]
            roles = ("requests", "results", "dlq")
            async with worker(r, "batch", o.engine, "echo", warm, o.timeout_s, roles=roles,
                              linger_ms=5) as w:  # fmt: skip
                say(f"baseline: {o.lines} requests from a raw aiokafka client")
                requests = [_request(f"raw-{i}", i) for i in range(o.lines)]
                report["baseline"] = await flood(w.client, requests, r.meter(w.proc), o.timeout_s)
                del requests
                report["batch"] = {}
                for lines in (small, o.lines):
                    say(f"batch: {lines} lines through `tokenmill batch run`")
                    run = await asyncio.to_thread(_batch_run, o, r, w.topics, lines)
                    report["batch"][str(lines)] = run
            report["warm_up_s"], report["worker_exit_code"] = w.warm_up_s, w.exit_code
    raw, big = report["baseline"]["requests_per_s"], report["batch"][str(o.lines)]
    rss = {"small": report["batch"][str(small)]["peak_rss_mb"], "large": big["peak_rss_mb"]}
    report["results"] = {
        "baseline_requests_per_s": raw,
        "batch_requests_per_s": big["requests_per_s"],
        "batch_vs_raw_client": ratio(big["requests_per_s"], raw),
        "peak_rss_mb": rss,
        "peak_rss_growth_mb": round(rss["large"] - rss["small"], 1),
        "client_cpu_us_per_line": round(big["cpu_s"] / o.lines * 1e6, 1),
    }
    report.headline("results", report["results"])
    return report.finish()


def _batch_run(o: BatchBenchOptions, r: Rig, topics: dict[str, str], lines: int) -> dict[str, Any]:
    source = r.tmp / f"in-{lines}.jsonl"
    with source.open("w") as f:
        for i in range(lines):
            body = {"model": o.engine.model, "prompt": [100 + i % 50, 7, 8, 9], "max_tokens": 2}
            f.write(
                json.dumps(
                    {
                        "custom_id": f"line-{i}",
                        "method": "POST",
                        "url": "/v1/completions",
                        "body": body,
                    }
                )
                + "\n"
            )
    connection, secrets = connection_argv(r.kafka)
    argv = [
        sys.executable,
        "-m",
        "ops",
        "batch",
        "run",
        str(source),
        "-o",
        str(r.tmp / f"out-{lines}.jsonl"),
        "--json",
        "--no-progress",
        *connection,
        "--max-inflight",
        str(o.max_inflight),
        "--topic",
        topics["requests"],
        "--results-topic",
        topics["results"],
        "--stall-timeout",
        str(o.timeout_s),
    ]
    measured = run_measured(argv, cwd=Path(__file__).resolve().parents[2], env=child_env(secrets))
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
