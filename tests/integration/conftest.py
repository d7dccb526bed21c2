"""Real services for integration tests, started once per session on free ports."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ops.kafka_local import LocalKafka
from ops.local_process import free_port


@pytest.fixture(scope="session")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    """A real single-node Kafka broker (KRaft) in a temporary state dir; stopped at the end."""
    broker = LocalKafka(state_dir=tmp_path_factory.mktemp("kafka"), port=free_port())
    broker.start(timeout=120)
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def kafka_bootstrap(kafka: LocalKafka) -> str:
    """The session broker's bootstrap address, "127.0.0.1:PORT"."""
    return kafka.bootstrap
