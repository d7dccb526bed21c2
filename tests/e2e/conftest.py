"""Real services for end-to-end tests: Jaeger v2 (built with Go on first use) on free ports."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ops.services.jaeger import LocalJaeger


@pytest.fixture(scope="session")
def jaeger(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalJaeger]:
    """A real Jaeger (in-memory traces) in a temporary state dir; stopped at the end."""
    local = LocalJaeger(
        state_dir=tmp_path_factory.mktemp("jaeger"), ui_port=0, otlp_grpc_port=0, otlp_http_port=0
    )
    local.start(timeout=120)
    try:
        yield local
    finally:
        local.stop()


# The session's real Kafka broker, shared with the integration tests' fixtures.
from tests.integration.conftest import kafka, kafka_bootstrap  # noqa: E402, F401
