"""Starting a Kafka client while the broker may be away: wait for it, never crash on it, but
stop at once on what waiting cannot mend.

A worker started before its broker, or an actor restarted during an outage, waits with a
jittered backoff (see `send_errors.backoff_s`) instead of spending the supervisor's restart
budget in seconds and exiting. When a start fails, `preflight` says why: bad credentials or an
untrusted certificate raise `KafkaUnusable` (the supervisor then gives up with that one line),
and so does a broker still away after `give_up_after_s`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Protocol, TypeVar

import structlog
from aiokafka.errors import KafkaError

from actors.kafka.connection import KafkaConnection
from actors.kafka.errors import KafkaUnusable
from actors.kafka.preflight import preflight
from actors.send_errors import backoff_s

log = structlog.get_logger("tokenmill.kafka")


class Settings(Protocol):
    """What a start needs of the worker's settings (`WorkerConfig`)."""

    @property
    def kafka(self) -> KafkaConnection: ...

    @property
    def connect_timeout_s(self) -> float | None: ...


class _Client(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...


C = TypeVar("C", bound=_Client)


async def started(
    make: Callable[[], C],
    *,
    name: str,
    stopping: asyncio.Event,
    settings: Settings,
) -> C | None:
    """A client from `make()`, started once the broker answers; None if `stopping` is set
    first. A client whose start failed is stopped and a new one made for the next try.
    `KafkaUnusable` when the connection (`settings.kafka`) cannot work, or the broker is
    still away after `settings.connect_timeout_s` (None: wait as long as it takes)."""
    connection, give_up_after_s = settings.kafka, settings.connect_timeout_s
    attempt = 0
    began = time.monotonic()
    while True:
        client = make()
        try:
            await client.start()
            if attempt:
                log.info(
                    "broker_answered", client=name, waited_s=round(time.monotonic() - began, 1)
                )
            return client
        except asyncio.CancelledError:
            await asyncio.shield(client.stop())  # a start cut short leaves no open client
            raise
        except (KafkaError, OSError) as exc:
            await client.stop()
            reach = await preflight(connection)
            if not reach.usable:
                raise KafkaUnusable(reach.reason) from None
            waited = time.monotonic() - began
            if give_up_after_s is not None and waited >= give_up_after_s:
                raise KafkaUnusable(
                    f"no broker answered within {give_up_after_s:g} s "
                    f"({reach.reason or _short(exc)})"
                ) from None
            delay = backoff_s(attempt)
            if give_up_after_s is not None:
                delay = min(delay, max(give_up_after_s - waited, 0.1))
            attempt += 1
            log.warning(
                "waiting_for_broker",
                client=name,
                error=reach.reason or _short(exc),
                retry_in_s=round(delay, 2),
                **connection.describe(),
            )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), delay)
            return None


def _short(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__
