"""A single-node Apache Kafka broker (KRaft, broker and controller in one JVM), run from its jars.

    kafka = LocalKafka(state_dir=Path("/tmp/k"), port=9092)
    kafka.start()      # or adopts the broker this state dir already runs
    kafka.bootstrap    # "127.0.0.1:9092"
    kafka.stop()

    secured = LocalKafka(state_dir=Path("/tmp/k"), security=("sasl_ssl", "mtls"))
    secured.start()
    secured.listener("sasl_ssl")            # "127.0.0.1:40123", a port of its own
    secured.client_properties("sasl_ssl")   # /tmp/k/client-sasl_ssl.properties, for librdkafka

No Docker: the broker is `java -cp "<jars>/*" kafka.Kafka server.properties` on the local JDK,
found by `ops.services.kafka_jars.KafkaRuntime`. Everything it owns lives in the state dir:

    server.properties, log4j2.properties   rendered on each start (server.properties 0600)
    data/                                  the log dir, formatted on first start, with the
                                           SCRAM users of `tokenmill`
    server.log                             the broker's log
    kafka.out                              the JVM's stdout and stderr
    broker.json                            pid and ports of the running broker
    sasl.password                          the `tokenmill` user's password (0600)
    security.json                          the secured listeners' ports; whether data/ has
                                           the SCRAM users
    tls/, client-<kind>.properties         with secured listeners: see `kafka_security`

The PLAINTEXT listener is always there (the controller, the readiness probe and `bootstrap` use
it); `security` adds TLS and SASL listeners, each on a port of its own, kept across restarts.
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
from ops.services.kafka_security import (
    KINDS,
    SASL_KINDS,
    BrokerSecurity,
    SecurityRecord,
    write_private,
)
from ops.services.local_process import accepts, bindable, free_port
from ops.services.local_service import LocalService, Recorded

MAX_MESSAGE_BYTES = 16 << 20
_HEAP = ("-Xms256m", "-Xmx768m")


def render_server_properties(
    *,
    port: int,
    controller_port: int,
    log_dir: Path,
    extra: Mapping[str, str] | None = None,
    listeners: Mapping[str, tuple[str, int]] | None = None,
) -> str:
    """One KRaft node that is both broker and controller, listening on 127.0.0.1 only;
    `listeners` (name → security protocol, port) are served beside PLAINTEXT, and `extra`
    settings are added (or override)."""
    served = {"PLAINTEXT": ("PLAINTEXT", port), **(listeners or {})}
    advertised = ",".join(f"{name}://127.0.0.1:{p}" for name, (_, p) in served.items())
    protocols = ",".join(f"{name}:{protocol}" for name, (protocol, _) in served.items())
    settings = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@127.0.0.1:{controller_port}",
        "listeners": f"{advertised},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": advertised,
        "controller.listener.names": "CONTROLLER",
        "listener.security.protocol.map": f"{protocols},CONTROLLER:PLAINTEXT",
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
        # Likewise the transaction log's: the first --exactly-once worker would make 50.
        "transaction.state.log.num.partitions": "4",
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
    """The broker whose files live in `state_dir`, serving on 127.0.0.1:`port`, and on a port
    of its own for each secured listener kind in `security` (`kafka_security.KINDS`).

    At most one broker runs per state dir. `start()` adopts one already running there (started
    by this process or another), and `stop()` stops whichever is recorded, so `tokenmill up` and
    `tokenmill down` can be separate processes. A port of 0 means any: a free one for a new
    broker, the running broker's own when adopting.
    """

    port: int = 9092
    controller_port: int = 0
    settings: Mapping[str, str] = field(default_factory=dict)  # broker settings to add
    security: tuple[str, ...] = ()  # secured listener kinds to serve
    # kind -> port of each secured listener the broker serves, once started or adopted
    secured_ports: dict[str, int] = field(default_factory=dict, init=False)

    _state_file = "broker.json"
    _port_fields = ("port", "controller_port")
    _output_file = "kafka.out"
    _log_files = ("server.log", "kafka.out")
    _log_lines = 25
    _title = "the broker"
    _start_error = KafkaStartError

    def __post_init__(self) -> None:
        super().__post_init__()
        self.security = tuple(dict.fromkeys(self.security))
        if unknown := [kind for kind in self.security if kind not in KINDS]:
            raise ValueError(f"unknown listener kinds {unknown}; known: {', '.join(KINDS)}")

    @property
    def bootstrap(self) -> str:
        """The PLAINTEXT listener, "127.0.0.1:PORT"."""
        return f"127.0.0.1:{self.port}"

    def listener(self, kind: str) -> str:
        """The secured listener `kind` of the started or adopted broker, "127.0.0.1:PORT"."""
        return f"127.0.0.1:{self._secured_port(kind)}"

    def client_properties(self, kind: str) -> Path:
        """The librdkafka properties file (0600) that reaches listener `kind` as `tokenmill`."""
        self._secured_port(kind)
        return self._security.client_properties_path(kind)

    def sasl_password(self) -> str:
        """The password of user `tokenmill` (SCRAM-SHA-512, SCRAM-SHA-256 and PLAIN)."""
        return self._security.password()

    def tls_file(self, name: str) -> Path:
        """A file of the broker's TLS material: `ca.pem`, `client.pem`, `client.key`."""
        return self._security.tls_file(name)

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
        served = self._security.recorded().listeners
        if missing := [kind for kind in self.security if kind not in served]:
            raise KafkaStartError(
                f"the broker of {self.state_dir} runs without the {', '.join(missing)} "
                f"listener; stop it first (`tokenmill down`) and start it with every --security "
                "kind it should serve"
            )
        super()._adopt(running)
        self.secured_ports = served

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
        data = self._path("data")
        formatted = (data / "meta.properties").is_file()
        record = self._security.recorded()
        if formatted and not record.scram and SASL_KINDS.intersection(self.security):
            raise KafkaStartError(
                f"{data} was formatted without the SCRAM users that a SASL listener needs; "
                f"use another --state-dir, or delete {self.state_dir} (its topics too) and retry"
            )
        runtime = KafkaRuntime.resolve()
        while self.controller_port in (0, self.port):
            self.controller_port = free_port()
        self.secured_ports = self._pick_secured_ports(record.listeners)
        props = self._path("server.properties")
        log4j2 = self._path("log4j2.properties")
        write_private(  # it holds the keystore's and the PLAIN user's passwords
            props,
            render_server_properties(
                port=self.port,
                controller_port=self.controller_port,
                log_dir=data,
                extra={**self._security.broker_settings(self.security), **self.settings},
                listeners=self._security.listeners(self.secured_ports),
            ),
        )
        log4j2.write_text(render_log4j2(self._path("server.log")))
        # Before formatting: a failed format leaves no meta.properties, so the next try formats.
        self._security.record(
            SecurityRecord(listeners=self.secured_ports, scram=record.scram or not formatted)
        )
        if not formatted:
            self._format(runtime, props, log4j2)
        for kind in KINDS:
            if kind in self.secured_ports:
                self._security.write_client_properties(kind, self.listener(kind))
            else:
                self._security.client_properties_path(kind).unlink(missing_ok=True)
        return runtime.command("kafka.Kafka", str(props), log4j2=log4j2, jvm=_HEAP)

    def _pick_secured_ports(self, recorded: Mapping[str, int]) -> dict[str, int]:
        """A port per secured listener: the last launch's while it is free (so client
        properties stay valid across restarts), else any free one."""
        taken = {self.port, self.controller_port}
        ports = {}
        for kind in self.security:
            port = recorded.get(kind, 0)
            if port in taken or not bindable(port):
                port = 0
            while port in taken or port == 0:
                port = free_port()
            ports[kind] = port
            taken.add(port)
        return ports

    @property
    def _security(self) -> BrokerSecurity:
        return BrokerSecurity(self.state_dir)

    def _secured_port(self, kind: str) -> int:
        if kind not in self.secured_ports:
            raise ValueError(
                f"the broker of {self.state_dir} serves no {kind} listener "
                f"(serves: {', '.join(self.secured_ports) or 'plaintext only'})"
            )
        return self.secured_ports[kind]

    def _format(self, runtime: KafkaRuntime, props: Path, log4j2: Path) -> None:
        argv = runtime.command(
            "kafka.tools.StorageTool",
            "format",
            "-t",
            _cluster_id(),
            "-c",
            str(props),
            *self._security.scram_arguments(),  # always, so later SASL listeners find the users
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
