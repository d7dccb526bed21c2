"""What the Kafka benchmarks stand on: a broker (the one given, or a local one started for the
run), topics named for the run, `tokenmill worker` subprocesses (its CLI, as deployed), and the
CPU seconds those processes use (`CpuMeter`: on a busy host they say more than wall time)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient

from actors.kafka.connection import KafkaConnection
from ops.bench.report import Narrate
from ops.connection.options import connection_argv
from ops.models.engine_options import EngineChoice
from ops.services.kafka import LocalKafka
from ops.services.local_process import free_port
from ops.services.topics import create_topics

ROLES = ("requests", "results", "dlq", "cancel")


@dataclass
class Rig:
    """One run's broker and the topics it made there."""

    kafka: KafkaConnection
    given: bool  # the user's broker, not one started here
    broker_pid: int | None  # when started here
    tmp: Path
    say: Narrate
    partitions: int = 6
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    made: list[str] = field(default_factory=list)

    async def topics(self, kind: str, roles: tuple[str, ...] = ROLES) -> dict[str, str]:
        """Fresh topics by role for one worker, so no worker reads another's requests."""
        names = {role: f"tokenmill-bench-{self.run_id}-{kind}.{role}" for role in roles}
        await create_topics(self.kafka, requests_partitions=self.partitions, names=names)
        self.made += names.values()
        return names

    def meter(self, worker: asyncio.subprocess.Process | None, **others: int | None) -> CpuMeter:
        pids = {"worker": worker.pid if worker else None, "client": os.getpid()}
        return CpuMeter(pids | others | {"broker": self.broker_pid})

    def facts(self) -> dict[str, Any]:
        """The broker: given or started here, where, and how reached (never a secret)."""
        described = self.kafka.describe()
        return {
            "broker": "given" if self.given else "started for this run, on this machine",
            "bootstrap": self.kafka.bootstrap_servers,
            "partitions": self.partitions,
        } | {k: described[k] for k in ("security_protocol", "sasl_mechanism") if k in described}


@contextlib.asynccontextmanager
async def rig(
    kafka: KafkaConnection | None, tmp: Path, say: Narrate, partitions: int = 6
) -> AsyncIterator[Rig]:
    """The given broker, or a local plaintext one on free ports in `tmp` (stopped on the way
    out); on a given broker the run's topics are deleted on the way out."""
    if kafka is not None:
        run = Rig(kafka, True, None, tmp, say, partitions)
        try:
            yield run
        finally:
            admin = AIOKafkaAdminClient(**kafka.client_kwargs())
            with contextlib.suppress(Exception):  # best effort: the user's broker keeps them
                await admin.start()
                await admin.delete_topics(run.made)
            await admin.close()
        return
    local = LocalKafka(state_dir=tmp / "kafka", port=free_port())
    say(f"kafka: starting a local broker on {local.bootstrap}")
    await asyncio.to_thread(local.start)
    try:
        yield Rig(KafkaConnection(local.bootstrap), False, local.pid, tmp, say, partitions)
    finally:
        await asyncio.to_thread(local.stop)


def worker_argv(
    choice: EngineChoice, kind: str, kafka: KafkaConnection, topics: dict[str, str], **more: object
) -> tuple[list[str], dict[str, str]]:
    """A bench worker's command line (engine options, topics, no HTTP server or control lane
    unless `more` flags say so) and the env vars holding the connection's secrets."""
    e = choice.engine
    flags: dict[str, object] = {
        "--model": choice.model, "--engine": kind, "--dtype": choice.dtype,
        "--device": choice.device, "--max-model-len": e.max_model_len,
        "--max-new-tokens-limit": e.max_new_tokens, "--max-num-seqs": e.max_num_seqs,
        "--max-num-batched-tokens": e.max_num_batched_tokens, "--num-kv-blocks": e.num_kv_blocks,
        "--group": f"{topics['requests']}.workers", "--requests-topic": topics["requests"],
        "--results-topic": topics["results"], "--dlq-topic": topics["dlq"],
        "--cancel-topic": topics.get("cancel", ""),  # none made for it: off
        "--worker-id": f"bench-{kind}", "--http-port": -1,
        "--control-topic": topics.get("control", ""), "--events-topic": topics.get("events"),
    } | {f"--{k.replace('_', '-')}": v for k, v in more.items()}  # fmt: skip
    connection, secrets = connection_argv(kafka)
    args = [str(x) for name, value in flags.items() if value is not None for x in (name, value)]
    argv = [sys.executable, "-c", "from ops.cli import main; main()", "worker", *connection, *args]
    return argv, secrets


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This environment without its TOKENMILL_* and OTEL_* settings, then `extra`: a child's
    settings are its flags and `extra` alone (an inherited TOKENMILL_KAFKA_CONFIG would
    otherwise mix with the connection its flags give)."""
    inherited = {k: v for k, v in os.environ.items() if not k.startswith(("TOKENMILL_", "OTEL_"))}
    return {**inherited, **(extra or {})}


@contextlib.asynccontextmanager
async def worker_process(
    argv: list[str], log: Path, env: dict[str, str] | None = None
) -> AsyncIterator[asyncio.subprocess.Process]:
    """Run the worker with `child_env(env)`; SIGTERM (a drain) on the way out, SIGKILL if it
    has not exited within a minute."""
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


def _stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU seconds process `pid` has used, all threads; None where unknown."""
    try:
        fields = _stat(pid) if pid is not None else []
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def child_pid(pid: int) -> int | None:
    """A process whose parent is `pid` (a worker's span export process), if any."""
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, IndexError, ValueError):
            if entry.name.isdigit() and int(_stat(int(entry.name))[1]) == pid:
                return int(entry.name)
    return None


class CpuMeter:
    """CPU seconds each named process uses between `start()` and `read()`."""

    def __init__(self, pids: dict[str, int | None]) -> None:
        self.pids, self.started = pids, dict[str, float | None]()

    def start(self) -> CpuMeter:
        self.started = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        return self

    def read(self) -> dict[str, float | None]:
        now = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        return {name: None if (b := self.started.get(name)) is None or t is None
                else round(t - b, 2) for name, t in now.items()}  # fmt: skip
