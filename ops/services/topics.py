"""The topics tokenmill reads and writes, created on a broker idempotently.

    await create_topics("127.0.0.1:9092")   -> the names it created (existing ones are kept)
    await describe_topics("127.0.0.1:9092") -> {"tokenmill.requests": 6, ...}

Topics are known by role (requests, results, dlq, control, events, cancel); a deployment may
rename any. The requests topic comes with its retry topics (`<requests>.retry.<N>`, one per
retry of a worker's `--max-attempts`, as many partitions as it has), which workers never
create themselves.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError, TopicAlreadyExistsError

from actors.config import DEFAULT_MAX_ATTEMPTS, retry_topic
from actors.kafka.connection import KafkaConnection, connection_of
from ops.errors import TopicCreateError
from ops.services.kafka import MAX_MESSAGE_BYTES

# role -> topic name
DEFAULT_TOPICS: Mapping[str, str] = MappingProxyType(
    {
        "requests": "tokenmill.requests",
        "results": "tokenmill.results",
        "dlq": "tokenmill.dlq",
        "control": "tokenmill.control",
        "events": "tokenmill.events",
        "cancel": "tokenmill.cancel",
    }
)
# Workers scale out over requests partitions (and its retry topics'); results get as many so a
# result can keep the partition of its request.
_WIDE_ROLES = frozenset({"requests", "retry", "results"})


def plan_topics(
    *,
    requests_partitions: int = 6,
    other_partitions: int = 1,
    names: Mapping[str, str] | None = None,
    configs: Mapping[str, str] | None = None,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
) -> list[NewTopic]:
    """The topics to create, by role: `names` (role -> name) or else all of `DEFAULT_TOPICS`,
    the requests topic with its retry topics for workers of `max_attempts`.

    The role decides the partition count and config, whatever the name; `configs` are added to
    (or override) every topic's config.
    """
    chosen = DEFAULT_TOPICS if names is None else names
    unknown = set(chosen) - set(DEFAULT_TOPICS)
    if unknown:
        raise TopicCreateError(
            f"unknown topic roles {sorted(unknown)}; known: {', '.join(DEFAULT_TOPICS)}"
        )
    roles = list(chosen.items())
    if "requests" in chosen:
        roles += [("retry", retry_topic(chosen["requests"], n)) for n in range(1, max_attempts)]
    return [
        NewTopic(
            name,
            requests_partitions if role in _WIDE_ROLES else other_partitions,
            replication_factor=1,
            # The worker rejects oversized requests itself, so the topic must let them in; a
            # dead letter keeps up to max_request_bytes of one, and results echo metadata.
            topic_configs={
                **(
                    {"max.message.bytes": str(MAX_MESSAGE_BYTES)}
                    if role in ("requests", "retry", "results", "dlq")
                    else {}
                ),
                **(configs or {}),
            },
        )
        for role, name in roles
    ]


async def create_topics(
    bootstrap: KafkaConnection | str,
    *,
    requests_partitions: int = 6,
    other_partitions: int = 1,
    names: Mapping[str, str] | None = None,
    configs: Mapping[str, str] | None = None,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    request_timeout_ms: int = 30_000,
) -> list[str]:
    """Create tokenmill's topics that do not exist yet; the names of those it created.

    `names` (role -> name) picks the roles and names; by default all of `DEFAULT_TOPICS`. The
    requests topic's retry topics come with it, for workers of `max_attempts` (1: none).
    Requests and results get `requests_partitions`, the others `other_partitions`; `configs`
    are added to every topic's config. An existing topic is left as it is, whatever its
    partition count or config. Returns once every topic shows in the broker's metadata. Raises
    `TopicCreateError` when the broker cannot be reached or refuses a topic for any reason but
    that it exists.
    """
    topics = plan_topics(
        requests_partitions=requests_partitions,
        other_partitions=other_partitions,
        names=names,
        configs=configs,
        max_attempts=max_attempts,
    )
    kafka = connection_of(bootstrap)
    admin = AIOKafkaAdminClient(**kafka.client_kwargs(), request_timeout_ms=request_timeout_ms)
    try:
        await admin.start()
        response = await admin.create_topics(topics, timeout_ms=request_timeout_ms)
        created = []
        for name, code, *message in response.topic_errors:
            if code == 0:
                created.append(name)
            elif code != TopicAlreadyExistsError.errno:
                detail = message[0] if message and message[0] else f"error code {code}"
                raise TopicCreateError(
                    f"the broker at {kafka.bootstrap_servers} refused topic {name}: {detail}"
                )
        async with asyncio.timeout(request_timeout_ms / 1000):
            await _until_visible(admin, [t.name for t in topics])
    except TimeoutError as exc:
        raise TopicCreateError("the topics were created but never showed in metadata") from exc
    except KafkaError as exc:
        raise TopicCreateError(
            f"cannot create topics on {kafka.bootstrap_servers}: {exc!r}"
        ) from exc
    finally:
        await admin.close()
    return created


async def describe_topics(
    bootstrap: KafkaConnection | str, *, request_timeout_ms: int = 30_000
) -> dict[str, int]:
    """Every non-internal topic on the broker with its partition count, by name."""
    kafka = connection_of(bootstrap)
    admin = AIOKafkaAdminClient(**kafka.client_kwargs(), request_timeout_ms=request_timeout_ms)
    try:
        await admin.start()
        return _partition_counts(await admin.describe_topics())
    finally:
        await admin.close()


async def _until_visible(admin: AIOKafkaAdminClient, names: list[str]) -> None:
    """Wait for the broker's metadata to catch up with the controller's (KRaft lags briefly)."""
    # Polls the broker: there is no local event to wait on.
    while not set(names) <= set(_partition_counts(await admin.describe_topics(names))):  # noqa: ASYNC110
        await asyncio.sleep(0.1)


def _partition_counts(topics: list[dict[str, Any]]) -> dict[str, int]:
    return {
        t["topic"]: len(t["partitions"])
        for t in topics
        if t["error_code"] == 0 and not t.get("is_internal", False)
    }
