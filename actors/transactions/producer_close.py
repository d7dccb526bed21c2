"""Closing a lane's transactional producer within a bound.

    await close_within(producer, limit_s, tp)

aiokafka's `stop()` waits for every batch the producer holds, and a transactional producer
never gives a batch up: one the broker does not take (a transaction the broker ended
meanwhile, say) would hold the close, and with it the hand-off and the worker's exit, forever.
Past `limit_s` what it holds is failed (the partition's next owner answers those records), and
past a second `limit_s` the producer is left behind, logged.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

import structlog
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from aiokafka.structs import TopicPartition

log = structlog.get_logger("tokenmill.transactions")


async def close_within(producer: AIOKafkaProducer, limit_s: float, tp: TopicPartition) -> None:
    """Stop `producer` (the lane of `tp`'s), failing its batches past `limit_s`."""
    stopping = asyncio.ensure_future(producer.stop())
    stopping.add_done_callback(lambda t: t.cancelled() or t.exception())  # seen, if left
    try:
        for forced in (False, True):
            try:
                await asyncio.wait_for(asyncio.shield(stopping), limit_s)
                return
            except TimeoutError:
                log.warning("lane_close_forced", topic=tp.topic, partition=tp.partition,
                            abandoned=forced)  # fmt: skip
                if forced:
                    return
                cast(Any, producer)._message_accumulator.fail_all(
                    KafkaError("the lane closed before the broker took this batch")
                )
    except KafkaError as exc:
        log.warning("lane_close_failed", topic=tp.topic, error=repr(exc))
