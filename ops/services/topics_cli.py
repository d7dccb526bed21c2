"""`tokenmill topics`: create and list tokenmill's Kafka topics."""

from __future__ import annotations

import asyncio
from typing import Any

import click
from aiokafka.errors import KafkaError

from actors.config import DEFAULT_MAX_ATTEMPTS, retry_topic
from ops.connection.check import ensure_reachable
from ops.connection.options import kafka_connection, kafka_options
from ops.errors import OpsError, TopicCreateError
from ops.services.topics import DEFAULT_TOPICS, create_topics, describe_topics


@click.group()
def topics() -> None:
    """tokenmill's Kafka topics: requests, results, dlq, control, events, cancel."""


@topics.command("create")
@kafka_options
@click.option(
    "--partitions",
    default=6,
    show_default=True,
    type=click.IntRange(min=1),
    help="Partitions of the requests (and retry) and results topics (the others get 1).",
)
@click.option(
    "--max-attempts",
    default=DEFAULT_MAX_ATTEMPTS,
    show_default=True,
    type=click.IntRange(min=1),
    help="The workers' --max-attempts: one retry topic per retry (requests.retry.1, ...).",
)
def create(partitions: int, max_attempts: int, **connection: Any) -> None:
    """Create the topics that do not exist yet; existing ones are left as they are.

    Prints one line per topic: created or exists, its name, its partition count.
    """
    kafka = kafka_connection(connection)
    try:
        asyncio.run(ensure_reachable(kafka, TopicCreateError))
        created = asyncio.run(
            create_topics(kafka, requests_partitions=partitions, max_attempts=max_attempts)
        )
        counts = asyncio.run(describe_topics(kafka))
    except (OpsError, KafkaError) as exc:
        raise click.ClickException(str(exc)) from exc
    requests = DEFAULT_TOPICS["requests"]
    retries = [retry_topic(requests, n) for n in range(1, max_attempts)]
    for name in [*DEFAULT_TOPICS.values(), *retries]:
        state = "created" if name in created else "exists "
        click.echo(f"{state}  {name}  {counts.get(name, '?')}")


@topics.command("list")
@kafka_options
def list_topics(**connection: Any) -> None:
    """List the broker's topics with their partition counts."""
    kafka = kafka_connection(connection)
    try:
        asyncio.run(ensure_reachable(kafka, TopicCreateError))
        counts = asyncio.run(describe_topics(kafka))
    except TopicCreateError as exc:
        raise click.ClickException(str(exc)) from exc
    except KafkaError as exc:
        raise click.ClickException(f"cannot reach {kafka.bootstrap_servers}: {exc!r}") from exc
    for name, partitions in sorted(counts.items()):
        click.echo(f"{name}  {partitions}")
