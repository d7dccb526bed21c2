"""Real services for integration tests, started once per session on free ports."""

from __future__ import annotations

import contextlib
from collections.abc import Generator, Iterator, Mapping
from pathlib import Path

import pytest

from ops.services.kafka import LocalKafka
from ops.services.kafka_security import KINDS
from ops.services.local_process import free_port
from tests.integration.gateway_fleet import fleet  # noqa: F401 - a fixture: the gateway tests'
from tests.integration.pipeline import STARTED

_FIRST_WORKER = pytest.StashKey[int]()  # how many workers had started before the test
LOG_TAIL_CHARS = 6000


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[_FIRST_WORKER] = len(STARTED)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed test's report ends with the log of every worker subprocess it started: what a
    worker was doing is most of what explains an integration failure, and CI keeps no files."""
    report: pytest.TestReport = yield
    if report.failed:
        for worker in STARTED[item.stash.get(_FIRST_WORKER, len(STARTED)) :]:
            with contextlib.suppress(OSError):
                tail = worker.log()[-LOG_TAIL_CHARS:]
                report.sections.append((f"worker log {worker.log_path}", tail))
    return report


@contextlib.contextmanager
def local_broker(
    state_dir: Path, settings: Mapping[str, str] | None = None, security: tuple[str, ...] = ()
) -> Iterator[LocalKafka]:
    """A real single-node Kafka broker (KRaft) on a free port, stopped when the block ends;
    `settings` are added to its server.properties, `security` are the secured listener kinds
    it serves beside PLAINTEXT."""
    broker = LocalKafka(
        state_dir=state_dir, port=free_port(), settings=dict(settings or {}), security=security
    )
    broker.start(timeout=120)
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    """The session's broker, in a temporary state dir, shared by the tests of a run."""
    with local_broker(tmp_path_factory.mktemp("kafka")) as broker:
        yield broker


@pytest.fixture(scope="session")
def secured_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    """The session's broker with every secured listener kind ("ssl", "mtls", "sasl_ssl",
    "sasl_plaintext"), for user `tokenmill`:

        secured_kafka.listener("sasl_ssl")           # "127.0.0.1:PORT" of that listener
        secured_kafka.client_properties("sasl_ssl")  # Path of its librdkafka properties file
        secured_kafka.bootstrap                      # the PLAINTEXT one, e.g. for create_topics
        secured_kafka.sasl_password()                # SCRAM-SHA-512/256 and PLAIN
        secured_kafka.tls_file("ca.pem")             # also "client.pem", "client.key" (mtls)

    SASL listeners also take OAUTHBEARER with any unsigned JWT (claims `sub` and `exp`).
    """
    with local_broker(tmp_path_factory.mktemp("kafka-secured"), security=KINDS) as broker:
        yield broker


@pytest.fixture(scope="session")
def kafka_bootstrap(kafka: LocalKafka) -> str:
    """The session broker's bootstrap address, "127.0.0.1:PORT"."""
    return kafka.bootstrap
