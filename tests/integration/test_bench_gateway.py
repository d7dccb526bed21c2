"""`tokenmill bench gateway` on a tiny workload against the session broker, from the CLI: an
echo worker, a `tokenmill gateway` subprocess, every path (plain and streamed) answered; the
report's shape and counts, never its timings (this machine's speed is not under test)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from click.testing import CliRunner

from ops.bench.cli import bench


async def test_both_paths_through_an_echo_worker_from_the_cli(
    kafka_bootstrap: str, tiny_checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    args = f"gateway --model {tiny_checkpoints['llama']} --max-model-len 128 --engine echo "
    args += f"--bootstrap-servers {kafka_bootstrap} --partitions 2 --requests 24 "
    args += f"--concurrency 4 --rounds 2 --prompt-tokens 8 --max-output 4 --json --out {tmp_path}"
    # The command runs its own event loop: off this test's loop, on a thread of its own.
    result = await asyncio.to_thread(CliRunner().invoke, bench, args.split())

    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    (written,) = await asyncio.to_thread(lambda: list(tmp_path.glob("*-gateway-echo-*.json")))
    assert report == json.loads(await asyncio.to_thread(written.read_text))
    assert report["benchmark"] == "gateway-echo"
    assert not [w for w in report["warnings"] if "answered" in w]  # a busy host may warn
    assert report["engine"]["kind"] == "echo"
    workload = report["workload"]
    assert (workload["requests_per_run"], workload["concurrency"], workload["rounds"]) == (24, 4, 2)
    # Rounds take turns at going first: the paths in order, then in the reverse order.
    paths = ["direct", "gateway", "direct-stream", "gateway-stream"]
    order = [(r["round"], r["path"]) for r in report["runs"]]
    assert order == [(1, p) for p in paths] + [(2, p) for p in reversed(paths)]
    for run in report["runs"]:
        assert (run["requests"], run["ok"], run["errors"]) == (24, 24, 0)
        assert set(run["cpu_s"]) == {"client", "gateway", "worker", "broker"}
    for path in paths:
        pooled = report[path]
        assert (pooled["requests"], pooled["ok"]) == (48, 48)
        assert set(pooled["latency_ms"]) == {"p50", "p99"}
        assert pooled["requests_per_s"] > 0
    for path in ("direct-stream", "gateway-stream"):  # every request timed to its first text
        assert None not in report[path]["first_text_ms"].values()
    assert set(report["added_latency_ms"]) == {"p50", "p99"}
    streamed = report["added_streamed_ms"]
    assert set(streamed) == {"first_text", "end"}
    assert None not in [*streamed["first_text"].values(), *streamed["end"].values()]
    assert len(report["ratios"]) == 2 and report["throughput_ratio"] is not None
    assert report["gateway"]["cpu_s"]["gateway"] is not None
    # The added latency's goal at p50, plain and to the first text; the ratio's is torch's.
    assert set(report["targets"]) == {"added_latency_p50_ms", "added_first_text_p50_ms"}
    argv = report["processes"]["argv"]
    assert argv["gateway"][0] == "gateway" and argv["worker"][0] == "worker"
    requests_topic = argv["worker"][argv["worker"].index("--requests-topic") + 1]
    assert argv["gateway"][argv["gateway"].index("--requests-topic") + 1] == requests_topic
