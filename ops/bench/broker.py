"""The broker a benchmark runs on: the one given, or a local one started for the run."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from aiokafka.admin import AIOKafkaAdminClient

from ops.bench.narrate import Narrate
from ops.services.kafka import LocalKafka
from ops.services.local_process import free_port


@contextlib.asynccontextmanager
async def broker(
    bootstrap: str | None, state_dir: Path, say: Narrate
) -> AsyncIterator[tuple[str, int | None]]:
    """The given broker, or a local one on free ports in `state_dir`, stopped on the way out.

    Yields its bootstrap address and, when started here, its pid.
    """
    if bootstrap is not None:
        yield bootstrap, None
        return
    kafka = LocalKafka(state_dir=state_dir, port=free_port())
    say(f"kafka: starting a local broker on {kafka.bootstrap}")
    await asyncio.to_thread(kafka.start)
    try:
        yield kafka.bootstrap, kafka.pid
    finally:
        await asyncio.to_thread(kafka.stop)


async def delete_topics(bootstrap: str, names: Sequence[str]) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    with contextlib.suppress(Exception):  # best effort: a broker we do not own keeps them
        await admin.start()
        await admin.delete_topics(list(names))
    await admin.close()
