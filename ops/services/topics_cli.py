"""`tokenmill topics`: create and list tokenmill's Kafka topics."""

from __future__ import annotations

import asyncio

import click
from aiokafka.errors import KafkaError

from ops.errors import OpsError
from ops.services.topics import DEFAULT_TOPICS, create_topics, describe_topics

_bootstrap_option = click.option(
    "--bootstrap-servers",
    "-b",
    envvar="TOKENMILL_BOOTSTRAP_SERVERS",
    default="127.0.0.1:9092",
    show_default=True,
    show_envvar=True,
    help="Kafka bootstrap address(es), comma-separated.",
)


@click.group()
def topics() -> None:
    """tokenmill's Kafka topics: requests, results, dlq, control, events."""


@topics.command("create")
@_bootstrap_option
@click.option(
    "--partitions",
    default=6,
    show_default=True,
    type=click.IntRange(min=1),
    help="Partitions of the requests and results topics (the others get 1).",
)
def create(bootstrap_servers: str, partitions: int) -> None:
    """Create the topics that do not exist yet; existing ones are left as they are.

    Prints one line per topic: created or exists, its name, its partition count.
    """
    try:
        created = asyncio.run(create_topics(bootstrap_servers, requests_partitions=partitions))
        counts = asyncio.run(describe_topics(bootstrap_servers))
    except (OpsError, KafkaError) as exc:
        raise click.ClickException(str(exc)) from exc
    for name in DEFAULT_TOPICS.values():
        state = "created" if name in created else "exists "
        click.echo(f"{state}  {name}  {counts.get(name, '?')}")


@topics.command("list")
@_bootstrap_option
def list_topics(bootstrap_servers: str) -> None:
    """List the broker's topics with their partition counts."""
    try:
        counts = asyncio.run(describe_topics(bootstrap_servers))
    except KafkaError as exc:
        raise click.ClickException(f"cannot reach {bootstrap_servers}: {exc!r}") from exc
    for name, partitions in sorted(counts.items()):
        click.echo(f"{name}  {partitions}")
