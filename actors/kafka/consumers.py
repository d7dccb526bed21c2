"""The worker's three consumers, as its settings make them (each a `PartitionReader`'s factory).

None commits on its own (`enable_auto_commit=False`): the ingest commits what the emitter
delivered; the cancel and control readers never commit. All read committed records only
(`isolation_level="read_committed"`): what an aborted transaction wrote is never seen.
"""

from __future__ import annotations

from aiokafka import AIOKafkaConsumer

from actors.config import WorkerConfig


def requests_consumer(config: WorkerConfig) -> AIOKafkaConsumer:
    """The ingest's: a member of the worker group, from the last commit (or the earliest)."""
    return AIOKafkaConsumer(
        **config.kafka.client_kwargs(),
        group_id=config.group,
        group_instance_id=config.group_instance_id,
        session_timeout_ms=config.session_timeout_ms,
        client_id=f"tokenmill-{config.worker_id}",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        # Requests produced in transactions (retries, other pipelines) count once committed;
        # an aborted one is never run.
        isolation_level="read_committed",
        max_partition_fetch_bytes=config.max_request_bytes + (64 << 10),
        fetch_max_wait_ms=config.fetch_max_wait_ms,
    )


def cancel_consumer(config: WorkerConfig) -> AIOKafkaConsumer:
    """In a group of its own per worker; never committed: the cancel actor seeks each
    assigned partition back to its recent cancels."""
    return AIOKafkaConsumer(
        **config.kafka.client_kwargs(),
        group_id=f"{config.group}.cancel.{config.worker_id}",
        client_id=f"tokenmill-{config.worker_id}-cancel",
        auto_offset_reset="latest",
        enable_auto_commit=False,
        isolation_level="read_committed",
    )


def control_consumer(config: WorkerConfig) -> AIOKafkaConsumer:
    """In a group of its own per worker; never committed: every start reads from the end, so
    a restarted worker does not apply again what it applied (or was killed by) before."""
    return AIOKafkaConsumer(
        **config.kafka.client_kwargs(),
        group_id=f"{config.group}.control.{config.worker_id}",
        client_id=f"tokenmill-{config.worker_id}-control",
        auto_offset_reset="latest",
        enable_auto_commit=False,
        isolation_level="read_committed",
    )
