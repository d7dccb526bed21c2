"""What a command does first: one connection that tells a broker that is away from a setting
that cannot work, so the command fails at once with one line naming the cause."""

from __future__ import annotations

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from actors.kafka.connection import KafkaConnection
from actors.kafka.preflight import preflight
from ops.errors import OpsError


async def ensure_reachable(kafka: KafkaConnection, error: type[OpsError]) -> None:
    """Raise `error` (one line, no secret) unless a bootstrap broker answers as configured."""
    reach = await preflight(kafka)
    if not reach.usable:
        raise error(f"kafka: {reach.reason}")
    if not reach.reachable:
        raise error(f"cannot reach Kafka at {kafka.bootstrap_servers} ({reach.reason})")


async def started_producer(
    kafka: KafkaConnection, error: type[OpsError], *, linger_ms: int = 5
) -> AIOKafkaProducer:
    """A started idempotent producer (acks=all) for a command, once the broker answers;
    `error` (with the address) when it cannot be reached. `linger_ms`: how long a record may
    wait for others to share its batch (a command sending many wants a few ms; a server
    answering one request at a time, none)."""
    await ensure_reachable(kafka, error)
    producer = AIOKafkaProducer(
        **kafka.producer_kwargs(), acks="all", enable_idempotence=True, linger_ms=linger_ms
    )
    try:
        await producer.start()
    except KafkaError as exc:
        await producer.stop()
        raise error(f"cannot reach Kafka at {kafka.bootstrap_servers} ({exc})") from exc
    return producer
