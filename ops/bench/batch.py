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
from ops.bench.gateway_batch import through_gateway
from ops.bench.load import flood, worker
from ops.bench.report import REPO, Narrate, Report, quiet, ratio
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
    gateway: bool = False  # also run each file as a batch of `tokenmill gateway`'s Batch API


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
        stdout, stderr = (f.read().decode(errors="replace") for f in (out, err))
    cpu = round(usage.ru_utime + usage.ru_stime, 2)
    return Measured(child.returncode, stdout, stderr, cpu, round(wall, 2))


def _prompt(i: int) -> list[int]:
    return [100 + i % 50, 7, 8, 9]


async def run_batch_bench(o: BatchBenchOptions, say: Narrate = quiet) -> Report:
    report = Report("batch")
    small = max(o.lines // 10, 1)
    report |= {
        "lines": o.lines, "small_lines": small, "max_inflight": o.max_inflight,
        "engine": "echo (no model; each result is its prompt's tokens)",
    }  # fmt: skip

    def requests(tag: str, n: int) -> list[GenerateRequest]:
        return [GenerateRequest(id=f"{tag}-{i}", prompt_token_ids=_prompt(i), max_new_tokens=2)
                for i in range(n)]  # fmt: skip

    with tempfile.TemporaryDirectory(prefix="tokenmill-bench-batch-") as tmp:
        async with rig(o.kafka, Path(tmp), say, o.partitions) as r:
            report["kafka"] = r.facts()
            say("worker (echo): starting and warming up")
            warm, roles = requests("warm", min(2000, o.lines)), ("requests", "results", "dlq")
            async with worker(r, "batch", o.engine, "echo", warm, o.timeout_s, roles=roles,
                              linger_ms=5) as w:  # fmt: skip
                say(f"baseline: {o.lines} requests from a raw aiokafka client")
                raw = requests("raw", o.lines)
                report["baseline"] = await flood(w.client, raw, r.meter(w.proc), o.timeout_s)
                del raw
                report["batch"], through = {}, {}
                for lines in (small, o.lines):
                    source = _source(o, r, lines)
                    say(f"batch: {lines} lines through `tokenmill batch run`")
                    run = await asyncio.to_thread(_batch_run, o, r, w.topics, source, lines)
                    report["batch"][str(lines)] = run
                    if o.gateway:
                        say(f"batch: {lines} lines through the gateway's /v1/batches")
                        through[str(lines)] = await through_gateway(
                            r, w.topics, source, lines, o.max_inflight, o.timeout_s
                        )
                if through:
                    report["gateway"] = through
            report["warm_up_s"], report["worker_exit_code"] = w.warm_up_s, w.exit_code
    rate, big = report["baseline"]["requests_per_s"], report["batch"][str(o.lines)]
    rss = {"small": report["batch"][str(small)]["peak_rss_mb"], "large": big["peak_rss_mb"]}
    report["results"] = {
        "baseline_requests_per_s": rate,
        "batch_requests_per_s": big["requests_per_s"],
        "batch_vs_raw_client": ratio(big["requests_per_s"], rate),
        "peak_rss_mb": rss,
        "peak_rss_growth_mb": round(rss["large"] - rss["small"], 1),
        "client_cpu_us_per_line": round(big["cpu_s"] / o.lines * 1e6, 1),
    }
    if o.gateway:
        gw = report["gateway"]
        gw_rate = gw[str(o.lines)]["requests_per_s"]
        gw_rss = {"small": gw[str(small)]["peak_rss_mb"], "large": gw[str(o.lines)]["peak_rss_mb"]}
        report["results"] |= {
            "gateway_requests_per_s": gw_rate,
            "gateway_vs_batch_run": ratio(gw_rate, big["requests_per_s"]),
            "gateway_peak_rss_mb": gw_rss,
            "gateway_peak_rss_growth_mb": (
                None if None in gw_rss.values() else round(gw_rss["large"] - gw_rss["small"], 1)
            ),
        }
    report.headline("results", report["results"])
    return report.finish()


def _source(o: BatchBenchOptions, r: Rig, lines: int) -> Path:
    source = r.tmp / f"in-{lines}.jsonl"
    with source.open("w") as f:
        for i in range(lines):
            body = {"model": o.engine.model, "prompt": _prompt(i), "max_tokens": 2}
            line = {"custom_id": f"line-{i}", "method": "POST", "url": "/v1/completions"}
            f.write(json.dumps(line | {"body": body}) + "\n")
    return source


def _batch_run(
    o: BatchBenchOptions, r: Rig, topics: dict[str, str], source: Path, lines: int
) -> dict[str, Any]:
    connection, secrets = connection_argv(r.kafka)
    argv = [
        sys.executable, "-m", "ops", "batch", "run", str(source),
        "-o", str(r.tmp / f"out-{lines}.jsonl"), "--json", "--no-progress", *connection,
        "--max-inflight", str(o.max_inflight), "--topic", topics["requests"],
        "--results-topic", topics["results"], "--stall-timeout", str(o.timeout_s),
    ]  # fmt: skip
    measured = run_measured(argv, cwd=REPO, env=child_env(secrets))
    if measured.returncode != 0:
        raise RuntimeError(f"tokenmill batch run failed:\n{measured.stderr[-3000:]}")
    summary = json.loads(measured.stdout)
    keep = ("complete", "ok", "wall_s", "requests_per_s", "peak_rss_mb")
    return {k: summary[k] for k in keep} | {
        "process_wall_s": measured.wall_s,  # with interpreter start-up and reading the file
        "cpu_s": measured.cpu_s,
    }
