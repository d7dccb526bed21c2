"""The broker a benchmark runs on: the one given, or a local one started for the run."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from aiokafka.admin import AIOKafkaAdminClient

from actors.kafka.connection import KafkaConnection
from ops.bench.narrate import Narrate
from ops.services.kafka import LocalKafka
from ops.services.local_process import free_port


@contextlib.asynccontextmanager
async def broker(
    kafka: KafkaConnection | None, state_dir: Path, say: Narrate
) -> AsyncIterator[tuple[KafkaConnection, int | None]]:
    """The given connection, or a local plaintext broker on free ports in `state_dir`, stopped
    on the way out.

    Yields the connection to it and, when started here, its pid.
    """
    if kafka is not None:
        yield kafka, None
        return
    local = LocalKafka(state_dir=state_dir, port=free_port())
    say(f"kafka: starting a local broker on {local.bootstrap}")
    await asyncio.to_thread(local.start)
    try:
        yield KafkaConnection(local.bootstrap), local.pid
    finally:
        await asyncio.to_thread(local.stop)


def kafka_facts(given: bool, kafka: KafkaConnection | None) -> dict[str, object]:
    """The report's account of the broker: given or started here, where, and how reached (no
    secret: only `describe()`'s protocol and mechanism)."""
    facts: dict[str, object] = {
        "broker": "given" if given else "started for this run, on this machine",
        "bootstrap": kafka.bootstrap_servers if kafka else None,
    }
    if kafka is not None:
        described = kafka.describe()
        facts |= {
            k: described[k] for k in ("security_protocol", "sasl_mechanism") if k in described
        }
    return facts


async def delete_topics(kafka: KafkaConnection, names: Sequence[str]) -> None:
    admin = AIOKafkaAdminClient(**kafka.client_kwargs())
    with contextlib.suppress(Exception):  # best effort: a broker we do not own keeps them
        await admin.start()
        await admin.delete_topics(list(names))
    await admin.close()
