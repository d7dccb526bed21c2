"""BrokerWatch: whether the cluster answers, for readiness and for one log line per change.

A worker's clients keep their last metadata while the broker is away, so nothing else in the
worker notices an outage until a send times out (and the ingest still counts as joined). This
child asks the cluster for its metadata every `interval_s` with a small admin client of its
own, and keeps what it learnt:

    probe ok ──► reachable          probe failed ──► unreachable since the first failure
    unknown ──failed──► unreachable (log kafka_unreachable)
    reachable ──failed──► unreachable (log kafka_unreachable)
    unreachable ──ok──► reachable (log kafka_reachable, down_s)

A failed probe closes the admin client; the next probe builds a new one, so nothing it held
from before the outage is trusted after it. No error ends `run()`: the watch only reports.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

import structlog
from aiokafka.admin import AIOKafkaAdminClient

from actors.kafka.connection import KafkaConnection

log = structlog.get_logger("tokenmill.kafka")

_ERROR_CHARS = 500  # of a failed probe's error, in its log line


class _Admin(Protocol):
    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def describe_cluster(self) -> object: ...


@dataclass(frozen=True)
class BrokerState:
    """What the probes said so far. `reachable` is None before the first probe ended."""

    reachable: bool | None = None
    down_since: float | None = None  # wall-clock s of the first failed probe of this outage


@dataclass(frozen=True)
class Change:
    """A transition, worth one log line: its event name and fields."""

    event: str
    fields: dict[str, object]


def observe(state: BrokerState, error: str | None, now: float) -> tuple[BrokerState, Change | None]:
    """The state after a probe that ended at `now` (wall clock), failed with `error` or
    succeeded (None), and the change to log, if it is one."""
    if error is None:
        if state.reachable is False and state.down_since is not None:
            down_s = round(max(now - state.down_since, 0.0), 3)
            return BrokerState(reachable=True), Change("kafka_reachable", {"down_s": down_s})
        return BrokerState(reachable=True), None
    if state.reachable is False:
        return state, None  # still down: since the first failure, not this one
    since = iso_utc(now)
    return BrokerState(False, now), Change("kafka_unreachable", {"since": since, "error": error})


def iso_utc(wall_s: float) -> str:
    """`2025-03-01T09:30:00Z`: an instant as the readiness probe and logs show it."""
    return datetime.fromtimestamp(wall_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class BrokerWatch:
    """Probes the cluster every `interval_s` until `stop()`; `run()` may be called again after.

    `reachable` is True once a probe succeeded and until one fails; `unreachable_since` is the
    first failure of the present outage (ISO-8601 UTC), None while reachable or before the
    first probe. A probe fails on any error or after `timeout_s`. `admin()` makes the client
    (default: an `AIOKafkaAdminClient` on `connection`); `clock` is the wall clock.
    """

    def __init__(
        self,
        connection: KafkaConnection,
        *,
        interval_s: float = 2.0,
        timeout_s: float = 5.0,
        admin: Callable[[], _Admin] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.name = "broker_watch"  # as the supervisor names its children
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.state = BrokerState()
        self._connection = connection
        self._make = admin or self._admin_client
        self._clock = clock
        self._client: _Admin | None = None
        self._stopping = asyncio.Event()

    @property
    def reachable(self) -> bool:
        return self.state.reachable is True

    @property
    def unreachable_since(self) -> str | None:
        since = self.state.down_since
        return iso_utc(since) if since is not None else None

    def stop(self) -> None:
        """Make `run()` close its client and return."""
        self._stopping.set()

    async def run(self) -> None:
        try:
            while not self._stopping.is_set():
                self.record(await self._probe())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), self.interval_s)
        finally:
            await self._close()
            self._stopping.clear()

    def record(self, error: str | None) -> None:
        """Take in a probe that just ended: failed with `error`, or succeeded (None)."""
        self.state, change = observe(self.state, error, self._clock())
        if change is None:
            return
        emit = log.info if self.state.reachable else log.warning
        emit(change.event, bootstrap_servers=self._connection.bootstrap_servers, **change.fields)

    async def _probe(self) -> str | None:
        """None when the cluster gave its metadata within `timeout_s`; else what went wrong."""
        try:
            async with asyncio.timeout(self.timeout_s):
                if self._client is None:
                    self._client = self._make()
                    await self._client.start()
                await self._client.describe_cluster()
            return None
        # KafkaError, OSError and TimeoutError are what an outage raises; anything else (from
        # a client half through its bootstrap) says no more, and must not crash the worker.
        except Exception as exc:
            await self._close()
            return repr(exc)[:_ERROR_CHARS]

    async def _close(self) -> None:
        client, self._client = self._client, None
        if client is None:
            return
        with contextlib.suppress(Exception):
            async with asyncio.timeout(self.timeout_s):
                await client.close()

    def _admin_client(self) -> _Admin:
        request_timeout_ms = int(self.timeout_s * 1000)
        client: _Admin = AIOKafkaAdminClient(
            **self._connection.client_kwargs(), request_timeout_ms=request_timeout_ms
        )
        return client
