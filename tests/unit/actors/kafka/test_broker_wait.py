"""Starting a client while the broker may be away: it waits, gives up after the connect
timeout, and stops at once on what waiting cannot mend. The broker here is a closed port."""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass

import pytest
from aiokafka.errors import KafkaConnectionError

from actors.kafka.broker_wait import started
from actors.kafka.connection import KafkaConnection
from actors.kafka.errors import KafkaUnusable


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Settings:
    kafka: KafkaConnection
    connect_timeout_s: float | None = None


class Client:
    """Fails to start `failures` times (as aiokafka does with no broker), then starts."""

    made = 0

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.stopped = 0

    async def start(self) -> None:
        Client.made += 1
        if Client.made <= self.failures:
            raise KafkaConnectionError("Unable to bootstrap from [('127.0.0.1', 1)]")

    async def stop(self) -> None:
        self.stopped += 1


@pytest.fixture(autouse=True)
def _count_from_zero() -> None:
    Client.made = 0


async def test_a_client_that_starts_on_a_later_try_is_returned() -> None:
    settings = Settings(KafkaConnection(f"127.0.0.1:{closed_port()}"))
    client = await started(lambda: Client(2), name="t", stopping=asyncio.Event(), settings=settings)
    assert isinstance(client, Client) and Client.made == 3


async def test_the_connect_timeout_ends_the_wait_naming_the_cause() -> None:
    port = closed_port()
    settings = Settings(KafkaConnection(f"127.0.0.1:{port}"), connect_timeout_s=0.3)
    with pytest.raises(
        KafkaUnusable, match=rf"no broker answered within 0.3 s \(cannot reach 127.0.0.1:{port}"
    ):
        await started(lambda: Client(10**6), name="t", stopping=asyncio.Event(), settings=settings)


async def test_draining_while_waiting_returns_none() -> None:
    stopping = asyncio.Event()
    stopping.set()
    settings = Settings(KafkaConnection(f"127.0.0.1:{closed_port()}"))
    assert (
        await started(lambda: Client(10**6), name="t", stopping=stopping, settings=settings) is None
    )
