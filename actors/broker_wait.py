"""Starting a Kafka client while the broker may be away: wait for it, never crash on it.

A worker started before its broker, or an actor restarted during an outage, waits with a
jittered backoff (see `send_errors.backoff_s`) instead of spending the supervisor's restart
budget in seconds and exiting.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Protocol, TypeVar

import structlog
from aiokafka.errors import KafkaError

from actors.send_errors import backoff_s

log = structlog.get_logger("tokenmill.kafka")


class _Client(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...


C = TypeVar("C", bound=_Client)


async def started(make: Callable[[], C], *, name: str, stopping: asyncio.Event) -> C | None:
    """A client from `make()`, started once the broker answers; None if `stopping` is set
    first. A client whose start failed is stopped and a new one made for the next try."""
    attempt = 0
    while True:
        client = make()
        try:
            await client.start()
            return client
        except KafkaError as exc:
            await client.stop()
            delay = backoff_s(attempt)
            attempt += 1
            log.warning("waiting_for_broker", client=name, error=repr(exc), retry_in_s=delay)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), delay)
            return None
