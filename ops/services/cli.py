"""`tokenmill up` / `tokenmill down`: a local Kafka broker and Jaeger for development and demos."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from ops.errors import OpsError
from ops.models.registry import cache_dir
from ops.services.jaeger import (
    DEFAULT_OTLP_GRPC_PORT,
    DEFAULT_OTLP_HTTP_PORT,
    DEFAULT_UI_PORT,
    LocalJaeger,
)
from ops.services.jaeger_build import JAEGER_VERSION, is_built
from ops.services.kafka import LocalKafka
from ops.services.kafka_jars import KAFKA_VERSION, is_resolved
from ops.services.kafka_security import KINDS, masked, read_properties

_STATE_DIR_HELP = "Where the broker keeps its config, data and logs [default: <cache>/run/kafka]."
_JAEGER_DIR_HELP = "Where Jaeger keeps its config and log [default: <cache>/run/jaeger]."


def default_state_dir() -> Path:
    """`<cache>/run/kafka`, the cache being `ops.models.registry.cache_dir()`
    (~/.cache/tokenmill)."""
    return cache_dir() / "run" / "kafka"


def default_jaeger_dir() -> Path:
    return cache_dir() / "run" / "jaeger"


def _port(name: str, default: int, what: str) -> Callable[[Callable[..., Any]], Any]:
    return click.option(
        name, default=default, show_default=True, type=click.IntRange(0, 65535), help=what
    )


@click.command()
@click.option(
    "--kafka-port",
    default=9092,
    show_default=True,
    type=click.IntRange(0, 65535),
    help="The port on 127.0.0.1; 0 picks a free one.",
)
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), help=_STATE_DIR_HELP)
@click.option(
    "--security",
    type=click.Choice(KINDS),
    multiple=True,
    help="Also serve a secured listener of this kind, on a port of its own (repeatable).",
)
@click.option("--jaeger", is_flag=True, help="Also start Jaeger v2 (built with Go on first use).")
@_port("--jaeger-ui-port", DEFAULT_UI_PORT, "Jaeger's UI and query API; 0 picks a free one.")
@_port("--otlp-grpc-port", DEFAULT_OTLP_GRPC_PORT, "Jaeger's OTLP gRPC receiver.")
@_port("--otlp-http-port", DEFAULT_OTLP_HTTP_PORT, "Jaeger's OTLP HTTP receiver.")
@click.option(
    "--jaeger-state-dir", type=click.Path(file_okay=False, path_type=Path), help=_JAEGER_DIR_HELP
)
def up(
    kafka_port: int,
    state_dir: Path | None,
    security: tuple[str, ...],
    jaeger: bool,
    **jaeger_options: Any,
) -> None:
    """Start a single-node Kafka broker (KRaft) and print its bootstrap address.

    The broker is Apache Kafka run from its Maven Central jars on the local JDK 17+ (the first
    run fetches them with Maven). It keeps running after this command returns. If the state
    dir's broker is already running it is reused. The address goes to stdout, so
    `export TOKENMILL_BOOTSTRAP_SERVERS=$(tokenmill up)` works.

    With --security the broker also serves secured listeners beside its PLAINTEXT one, each on
    127.0.0.1 and a free port kept across restarts, for user `tokenmill` whose password is made
    once per state dir (certificates too, by `openssl`, under <state-dir>/tls):

    \b
      ssl             TLS
      mtls            TLS with a client certificate (tls/client.pem, tls/client.key)
      sasl_ssl        SASL over TLS: SCRAM-SHA-512, SCRAM-SHA-256, PLAIN, OAUTHBEARER
      sasl_plaintext  the same SASL mechanisms without TLS

    OAUTHBEARER takes any unsigned JWT: a test broker's convenience. For each kind stderr shows
    its address and its client properties file, <state-dir>/client-KIND.properties, usable as
    is by librdkafka clients (password masked here); stdout gives the first secured listener's
    address instead, so `export TOKENMILL_BOOTSTRAP_SERVERS=$(tokenmill up --security sasl_ssl)`
    works. A running broker lacking a requested listener must be stopped first.
    """
    kafka = LocalKafka(
        state_dir=state_dir or default_state_dir(), port=kafka_port, security=security
    )
    if not is_resolved():
        click.echo(f"kafka: fetching Kafka {KAFKA_VERSION} jars with Maven (first run)", err=True)
    try:
        started = kafka.start()
    except OpsError as exc:
        raise click.ClickException(str(exc)) from exc
    state = "started" if started else "already running"
    address = kafka.bootstrap
    click.echo(f"kafka: {state} on {address} (pid {kafka.pid}, {kafka.state_dir})", err=True)
    for kind in kafka.security:
        _show_listener(kafka, kind)
    connect = (
        f"--kafka-config {kafka.client_properties(kafka.security[0])}"
        if kafka.security
        else f"-b {address}"
    )
    click.echo(f"kafka: create the topics with `tokenmill topics create {connect}`", err=True)
    if jaeger:
        _start_jaeger(**jaeger_options)
    click.echo(kafka.listener(kafka.security[0]) if kafka.security else address)


def _show_listener(kafka: LocalKafka, kind: str) -> None:
    path = kafka.client_properties(kind)
    click.echo(f"kafka: {kind} on {kafka.listener(kind)}, client properties {path}:", err=True)
    for key, value in masked(read_properties(path)).items():
        click.echo(f"kafka:   {key}={value}", err=True)


def _start_jaeger(
    jaeger_ui_port: int, otlp_grpc_port: int, otlp_http_port: int, jaeger_state_dir: Path | None
) -> None:
    local = LocalJaeger(
        state_dir=jaeger_state_dir or default_jaeger_dir(),
        ui_port=jaeger_ui_port,
        otlp_grpc_port=otlp_grpc_port,
        otlp_http_port=otlp_http_port,
    )
    if not is_built():
        click.echo(f"jaeger: building Jaeger {JAEGER_VERSION} with Go (first run)", err=True)
    try:
        started = local.start()
    except OpsError as exc:  # Kafka is up and stays usable: say why Jaeger is not
        click.echo(f"jaeger: not started: {exc}", err=True)
        return
    state = "started" if started else "already running"
    click.echo(f"jaeger: {state}, UI and query API at {local.ui_url} (pid {local.pid})", err=True)
    click.echo(f"jaeger: export OTEL_EXPORTER_OTLP_ENDPOINT={local.otlp_http}", err=True)


@click.command()
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), help=_STATE_DIR_HELP)
@click.option(
    "--jaeger-state-dir", type=click.Path(file_okay=False, path_type=Path), help=_JAEGER_DIR_HELP
)
def down(state_dir: Path | None, jaeger_state_dir: Path | None) -> None:
    """Stop what `tokenmill up` started: the broker (SIGTERM, then SIGKILL after 20 s) and
    Jaeger when it runs."""
    kafka = LocalKafka(state_dir=state_dir or default_state_dir())
    pid = kafka.stop()
    if pid is None:
        click.echo(f"kafka: none running ({kafka.state_dir})")
    else:
        click.echo(f"kafka: stopped (pid {pid})")
    jaeger_pid = LocalJaeger(state_dir=jaeger_state_dir or default_jaeger_dir()).stop()
    if jaeger_pid is not None:
        click.echo(f"jaeger: stopped (pid {jaeger_pid})")
