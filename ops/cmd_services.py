"""`tokenmill up` / `tokenmill down`: a local Kafka broker for development and demos."""

from __future__ import annotations

from pathlib import Path

import click

from ops.errors import OpsError
from ops.kafka_jars import KAFKA_VERSION, is_resolved
from ops.kafka_local import LocalKafka
from ops.models import cache_dir

_STATE_DIR_HELP = "Where the broker keeps its config, data and logs [default: <cache>/run/kafka]."


def default_state_dir() -> Path:
    """`<cache>/run/kafka`, the cache being `ops.models.cache_dir()` (~/.cache/tokenmill)."""
    return cache_dir() / "run" / "kafka"


@click.command()
@click.option(
    "--kafka-port",
    default=9092,
    show_default=True,
    type=click.IntRange(0, 65535),
    help="The port on 127.0.0.1; 0 picks a free one.",
)
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), help=_STATE_DIR_HELP)
def up(kafka_port: int, state_dir: Path | None) -> None:
    """Start a single-node Kafka broker (KRaft) and print its bootstrap address.

    The broker is Apache Kafka run from its Maven Central jars on the local JDK 17+ (the first
    run fetches them with Maven). It keeps running after this command returns. If the state
    dir's broker is already running it is reused. The address goes to stdout, so
    `export TOKENMILL_BOOTSTRAP_SERVERS=$(tokenmill up)` works.
    """
    kafka = LocalKafka(state_dir=state_dir or default_state_dir(), port=kafka_port)
    if not is_resolved():
        click.echo(f"kafka: fetching Kafka {KAFKA_VERSION} jars with Maven (first run)", err=True)
    try:
        started = kafka.start()
    except OpsError as exc:
        raise click.ClickException(str(exc)) from exc
    state = "started" if started else "already running"
    address = kafka.bootstrap
    click.echo(f"kafka: {state} on {address} (pid {kafka.pid}, {kafka.state_dir})", err=True)
    click.echo(f"kafka: create the topics with `tokenmill topics create -b {address}`", err=True)
    click.echo(kafka.bootstrap)


@click.command()
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), help=_STATE_DIR_HELP)
def down(state_dir: Path | None) -> None:
    """Stop the broker `tokenmill up` started (SIGTERM, then SIGKILL after 20 s)."""
    kafka = LocalKafka(state_dir=state_dir or default_state_dir())
    pid = kafka.stop()
    if pid is None:
        click.echo(f"kafka: none running ({kafka.state_dir})")
    else:
        click.echo(f"kafka: stopped (pid {pid})")
