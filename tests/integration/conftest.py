"""Real services for integration tests, started once per session on free ports."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from ops.services.kafka import LocalKafka
from ops.services.local_process import free_port


@contextlib.contextmanager
def local_broker(
    state_dir: Path, settings: Mapping[str, str] | None = None
) -> Iterator[LocalKafka]:
    """A real single-node Kafka broker (KRaft) on a free port, stopped when the block ends;
    `settings` are added to its server.properties."""
    broker = LocalKafka(state_dir=state_dir, port=free_port(), settings=dict(settings or {}))
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
def kafka_bootstrap(kafka: LocalKafka) -> str:
    """The session broker's bootstrap address, "127.0.0.1:PORT"."""
    return kafka.bootstrap
