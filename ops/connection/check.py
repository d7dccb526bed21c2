"""What a command does first: one connection that tells a broker that is away from a setting
that cannot work, so the command fails at once with one line naming the cause."""

from __future__ import annotations

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
