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
import subprocess
import uuid
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from ops.errors import KafkaStartError
from ops.services.kafka_jars import KafkaRuntime
from ops.services.local_process import accepts, bindable, free_port
from ops.services.local_service import LocalService, Recorded

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


@dataclass
class LocalKafka(LocalService):
    """The broker whose files live in `state_dir`, serving on 127.0.0.1:`port`.

    At most one broker runs per state dir. `start()` adopts one already running there (started
    by this process or another), and `stop()` stops whichever is recorded, so `tokenmill up` and
    `tokenmill down` can be separate processes. A port of 0 means any: a free one for a new
    broker, the running broker's own when adopting.
    """

    port: int = 9092
    controller_port: int = 0
    settings: Mapping[str, str] = field(default_factory=dict)  # broker settings to add

    _state_file = "broker.json"
    _port_fields = ("port", "controller_port")
    _output_file = "kafka.out"
    _log_files = ("server.log", "kafka.out")
    _log_lines = 25
    _title = "the broker"
    _start_error = KafkaStartError

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 90.0) -> bool:
        """Start the broker, or adopt the running one, and wait until it serves.

        True when this call started it. Raises `KafkaStartError` (port taken, the state dir's
        broker on another port, no answer within `timeout` s) or `KafkaRuntimeUnavailable`.
        """
        return super().start(timeout)

    def stop(self, grace: float = 20.0) -> int | None:
        """Stop the state dir's broker: SIGTERM, SIGKILL after `grace` s. Its pid, or None."""
        return super().stop(grace)

    def wait_ready(self, timeout: float = 90.0) -> None:
        """Block until the broker lists itself in metadata; `KafkaStartError` if it exits first."""
        super().wait_ready(timeout)

    def _adopt(self, running: Recorded) -> None:
        if self.port not in (0, running.ports["port"]):
            raise KafkaStartError(
                f"the broker of {self.state_dir} already serves on port {running.ports['port']}, "
                f"not {self.port}; stop it first (`tokenmill down`) or use that port"
            )
        super()._adopt(running)

    def _ready(self) -> bool:
        return accepts(self.port) and probe(self.bootstrap)

    def _awaited(self) -> str:
        return f"the broker on {self.bootstrap}"

    def _markers(self) -> tuple[str, ...]:
        return ("kafka.Kafka", str(self._path("server.properties")))

    def _command(self) -> list[str]:
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
        return runtime.command("kafka.Kafka", str(props), log4j2=log4j2, jvm=_HEAP)

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


def _cluster_id() -> str:
    """A random Kafka cluster id: 16 bytes, unpadded url-safe base64 (22 characters)."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cid.startswith("-"):  # StorageTool would read it as an option
            return cid
