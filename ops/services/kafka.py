"""A single-node Apache Kafka broker (KRaft, broker and controller in one JVM), run from its jars.

    kafka = LocalKafka(state_dir=Path("/tmp/k"), port=9092)
    kafka.start()      # or adopts the broker this state dir already runs
    kafka.bootstrap    # "127.0.0.1:9092"
    kafka.stop()

No Docker: the broker is `java -cp "<jars>/*" kafka.Kafka server.properties` on the local JDK,
found by `ops.services.kafka_jars.KafkaRuntime`. Everything it owns lives in the state dir:

    server.properties, log4j2.properties   rendered on each start
    data/                                  the log dir, formatted on first start
    server.log                             the broker's log
    kafka.out                              the JVM's stdout and stderr
    broker.json                            pid and ports of the running broker
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import subprocess
import uuid
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from ops.errors import KafkaStartError
from ops.services.kafka_jars import KafkaRuntime, file_lock
from ops.services.local_process import (
    accepts,
    alive,
    bindable,
    free_port,
    runs_with,
    spawn_detached,
    terminate,
    wait_until,
)

MAX_MESSAGE_BYTES = 16 << 20
_HEAP = ("-Xms256m", "-Xmx768m")


def render_server_properties(
    *, port: int, controller_port: int, log_dir: Path, extra: Mapping[str, str] | None = None
) -> str:
    """One KRaft node that is both broker and controller, listening on 127.0.0.1 only;
    `extra` settings are added (or override)."""
    settings = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@127.0.0.1:{controller_port}",
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "controller.listener.names": "CONTROLLER",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name": "PLAINTEXT",
        "log.dirs": str(log_dir),
        "offsets.topic.replication.factor": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        "num.partitions": "1",
        # Oversized messages must reach the worker, which rejects them itself.
        "message.max.bytes": str(MAX_MESSAGE_BYTES),
        "replica.fetch.max.bytes": str(MAX_MESSAGE_BYTES),
        # Topics are made by `tokenmill topics create` only: a request cannot make one.
        "auto.create.topics.enable": "false",
        # The default 50 partitions make the first consumer-group join take seconds.
        "offsets.topic.num.partitions": "4",
        **(extra or {}),
    }
    return "".join(f"{key}={value}\n" for key, value in settings.items())


def render_log4j2(log_file: Path) -> str:
    """log4j2 config sending everything at INFO to one file (nothing to the console)."""
    return f"""status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log_file}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
"""


def probe(bootstrap: str, timeout: float = 5.0) -> bool:
    """Whether the broker at `bootstrap` answers a metadata request listing a live broker.

    Runs its own event loop on a helper thread, so callers may be inside a running loop.
    """

    async def ask() -> bool:
        admin = AIOKafkaAdminClient(
            bootstrap_servers=bootstrap, request_timeout_ms=int(timeout * 1000)
        )
        try:
            await admin.start()
            return bool((await admin.describe_cluster())["brokers"])
        except KafkaError:
            return False
        finally:
            await admin.close()

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(lambda: asyncio.run(ask())).result()


@dataclass(frozen=True)
class _Recorded:
    pid: int
    port: int
    controller_port: int


@dataclass
class LocalKafka:
    """The broker whose files live in `state_dir`, serving on 127.0.0.1:`port`.

    At most one broker runs per state dir. `start()` adopts one already running there (started
    by this process or another), and `stop()` stops whichever is recorded, so `tokenmill up` and
    `tokenmill down` can be separate processes. A port of 0 means any: a free one for a new
    broker, the running broker's own when adopting.
    """

    state_dir: Path
    port: int = 9092
    controller_port: int = 0
    settings: Mapping[str, str] = field(default_factory=dict)  # broker settings to add
    pid: int | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        # Absolute: the broker's command line names its config, and `stop()` matches on it.
        self.state_dir = self.state_dir.expanduser().resolve()

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 90.0) -> bool:
        """Start the broker, or adopt the running one, and wait until it serves.

        True when this call started it. Raises `KafkaStartError` (port taken, the state dir's
        broker on another port, no answer within `timeout` s) or `KafkaRuntimeUnavailable`.
        """
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with file_lock(self.state_dir / ".lock"):
            running = self._running()
            if running is not None:
                if self.port not in (0, running.port):
                    raise KafkaStartError(
                        f"the broker of {self.state_dir} already serves on port {running.port}, "
                        f"not {self.port}; stop it first (`tokenmill down`) or use that port"
                    )
                self.port, self.controller_port = running.port, running.controller_port
                self.pid = running.pid
                self.wait_ready(timeout)
                return False
            self._launch()
            try:
                self.wait_ready(timeout)
            except KafkaStartError:
                self._kill(grace=5.0)
                raise
            return True

    def stop(self, grace: float = 20.0) -> int | None:
        """Stop the state dir's broker: SIGTERM, SIGKILL after `grace` s. Its pid, or None."""
        if not self.state_dir.is_dir():
            return None
        with file_lock(self.state_dir / ".lock"):
            return self._kill(grace)

    def wait_ready(self, timeout: float = 90.0) -> None:
        """Block until the broker lists itself in metadata; `KafkaStartError` if it exits first."""
        failed = wait_until(
            lambda: accepts(self.port) and probe(self.bootstrap), pid=self.pid, timeout=timeout
        )
        if failed == "exited":
            raise KafkaStartError(f"the broker (pid {self.pid}) exited; {self._log_tail()}")
        if failed == "timeout":
            raise KafkaStartError(
                f"the broker on {self.bootstrap} did not answer within {timeout:.0f} s; "
                + self._log_tail()
            )

    def _launch(self) -> None:
        if self.port == 0:
            self.port = free_port()
        if not bindable(self.port):
            raise KafkaStartError(
                f"port {self.port} on 127.0.0.1 is already in use; pick another (--kafka-port) "
                "or stop what listens there"
            )
        runtime = KafkaRuntime.resolve()
        while self.controller_port in (0, self.port):
            self.controller_port = free_port()
        props = self._path("server.properties")
        log4j2 = self._path("log4j2.properties")
        data = self._path("data")
        props.write_text(
            render_server_properties(
                port=self.port,
                controller_port=self.controller_port,
                log_dir=data,
                extra=self.settings,
            )
        )
        log4j2.write_text(render_log4j2(self._path("server.log")))
        if not (data / "meta.properties").is_file():
            self._format(runtime, props, log4j2)
        argv = runtime.command("kafka.Kafka", str(props), log4j2=log4j2, jvm=_HEAP)
        self.pid = spawn_detached(argv, self._path("kafka.out"))
        recorded = _Recorded(self.pid, self.port, self.controller_port)
        self._path("broker.json").write_text(json.dumps(dataclasses.asdict(recorded)) + "\n")

    def _format(self, runtime: KafkaRuntime, props: Path, log4j2: Path) -> None:
        argv = runtime.command(
            "kafka.tools.StorageTool",
            "format",
            "-t",
            _cluster_id(),
            "-c",
            str(props),
            log4j2=log4j2,
        )
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
        if done.returncode != 0:
            raise KafkaStartError(
                f"formatting {self._path('data')} failed (exit {done.returncode}); delete "
                f"{self.state_dir} and retry:\n{(done.stdout + done.stderr).strip()[-2000:]}"
            )

    def _running(self) -> _Recorded | None:
        """The recorded broker if it still runs; a stale record (dead or reused pid) is None."""
        try:
            recorded = _Recorded(**json.loads(self._path("broker.json").read_text()))
        except (OSError, ValueError, TypeError):
            return None
        if not alive(recorded.pid) or not runs_with(
            recorded.pid, "kafka.Kafka", str(self._path("server.properties"))
        ):
            return None
        return recorded

    def _kill(self, grace: float) -> int | None:
        running = self._running()
        self._path("broker.json").unlink(missing_ok=True)
        self.pid = None
        if running is None:
            return None
        terminate(running.pid, grace)
        return running.pid

    def _path(self, name: str) -> Path:
        return self.state_dir / name

    def _log_tail(self, lines: int = 25) -> str:
        parts = []
        for name in ("server.log", "kafka.out"):
            path = self._path(name)
            if path.is_file():
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                parts.append(f"--- {path} (last {len(tail)} lines)\n" + "\n".join(tail))
        return "\n".join(parts) if parts else f"no log in {self.state_dir}"


def _cluster_id() -> str:
    """A random Kafka cluster id: 16 bytes, unpadded url-safe base64 (22 characters)."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cid.startswith("-"):  # StorageTool would read it as an option
            return cid
