"""The worker under test: a `tokenmill worker` subprocess, and the CPU seconds processes use.

`worker_argv` builds the command line from the benchmark's engine options, its Kafka connection
and this run's topics, with the env vars that carry the connection's secrets; `worker_process`
runs it with nothing else inherited from this environment's TOKENMILL_* settings and drains it
on the way out. `CpuMeter` reads /proc for the CPU seconds the worker,
the load generator and the broker use over one measurement.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

from actors.kafka.connection import KafkaConnection
from ops.connection.options import connection_argv
from ops.models.engine_options import EngineChoice


def worker_argv(
    choice: EngineChoice, kind: str, kafka: KafkaConnection, topics: dict[str, str]
) -> tuple[list[str], dict[str, str]]:
    """The bench worker's command line, and the env vars it needs (see `worker_command`)."""
    e = choice.engine
    flags = {
        "--model": choice.model,
        "--engine": kind,
        "--dtype": choice.dtype,
        "--device": choice.device,
        "--max-model-len": e.max_model_len,
        "--max-new-tokens-limit": e.max_new_tokens,
        "--max-num-seqs": e.max_num_seqs,
        "--max-batched-tokens": e.max_num_batched_tokens,
        "--num-kv-blocks": e.num_kv_blocks,
        "--group": f"{topics['requests']}.workers",
        "--requests-topic": topics["requests"],
        "--results-topic": topics["results"],
        "--dlq-topic": topics["dlq"],
        "--cancel-topic": topics.get("cancel", ""),  # no cancel topic made for it: off
        "--worker-id": f"bench-{kind}",
        "--http-port": -1,  # benchmarks measure the pipeline: no HTTP server, no control plane
        "--control-topic": "",
    }
    return worker_command(flags, kafka)


def worker_command(
    flags: Mapping[str, object], kafka: KafkaConnection
) -> tuple[list[str], dict[str, str]]:
    """`tokenmill worker` in a fresh interpreter with `flags` (those set to None left out) on
    `kafka`; and the env vars holding the connection's secrets, kept off the command line."""
    connection, secrets = connection_argv(kafka)
    args = [str(x) for name, value in flags.items() if value is not None for x in (name, value)]
    argv = [sys.executable, "-c", "from ops.cli import main; main()", "worker", *connection, *args]
    return argv, secrets


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This environment without its TOKENMILL_* and OTEL_* settings, then `extra`: a child's
    settings are its flags and `extra` alone (an inherited TOKENMILL_KAFKA_CONFIG or
    TOKENMILL_SECURITY_PROTOCOL would otherwise mix with the connection its flags give)."""
    inherited = {k: v for k, v in os.environ.items() if not k.startswith(("TOKENMILL_", "OTEL_"))}
    return {**inherited, **(extra or {})}


@contextlib.asynccontextmanager
async def worker_process(
    argv: list[str], log: Path, env: dict[str, str] | None = None
) -> AsyncIterator[asyncio.subprocess.Process]:
    """Run the worker with only these settings (no TOKENMILL_* or OTEL_* from this
    environment; `env` adds its own); SIGTERM (a drain) on the way out, SIGKILL if it has
    not exited within a minute."""
    with log.open("ab") as out:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out, env=child_env(env)
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


def log_tail(log: Path, lines: int = 30) -> str:
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


def child_pids(pid: int | None) -> list[int]:
    """The processes whose parent is `pid` (e.g. a worker's span export process)."""
    if pid is None:
        return []
    children = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        if int(fields[1]) == pid:
            children.append(int(entry.name))
    return children


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
