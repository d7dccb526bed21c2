"""Readiness of a consumer that reads a topic from its end (control, cancel): it is ready once
every partition of its newest assignment has a resolved position, so a record produced after
that is seen."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from aiokafka import AIOKafkaConsumer
from aiokafka.errors import IllegalStateError


async def ready_on_each_assignment(
    consumer: AIOKafkaConsumer,
    assigned: asyncio.Event,
    ready: asyncio.Event,
    on_ready: Callable[[int], None],
) -> None:
    """Forever: after `assigned` is set (by the rebalance listener), resolve every position,
    then set `ready` and call `on_ready(partitions)`, unless another assignment came meanwhile
    (its own round sets it)."""
    while True:
        await assigned.wait()
        assigned.clear()
        try:
            for tp in consumer.assignment():
                await consumer.position(tp)
        except IllegalStateError:  # revoked meanwhile: the next assignment sets it
            continue
        if not assigned.is_set():
            ready.set()
            on_ready(len(consumer.assignment()))
