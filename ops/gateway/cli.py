"""`tokenmill gateway`: OpenAI's HTTP API in front of the Kafka fleet."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path
from typing import Any

import click

from ops.connection.options import kafka_connection, kafka_options
from ops.gateway.settings import GatewaySettings
from ops.settings import build, config_file_option, options


@click.command()
@config_file_option("gateway")
@kafka_options
@options(GatewaySettings)
def gateway(**kwargs: Any) -> None:
    """Serve OpenAI's HTTP API (completions, chat completions, models, files and batches) onto
    the Kafka fleet.

    Each body is mapped as `tokenmill batch run` maps a batch line, sent to the requests topic
    with `reply_to` set to this instance's own reply topic
    (`tokenmill.gateway.<instance>.results`, created at start, deleted at a clean stop), and
    answered from the worker's result; `stream: true` is answered as Server-Sent Events from
    the workers' chunks. /v1/files and /v1/batches keep their state in --batch-dir; a batch
    left unfinished resumes when a gateway starts on that folder again. Listening beyond
    loopback needs --api-key-file. Loads no model:
    the workers tokenize and generate. Reference: docs/gateway.md.
    """
    from ops.connection.check import ensure_reachable
    from ops.gateway.errors import GatewayStartError
    from ops.gateway.keys import KeyCheck, read_keys
    from ops.gateway.server import gateway_server
    from ops.worker.telemetry import setup_tracing, shutdown_tracing

    kafka = kafka_connection(kwargs)
    settings = build(GatewaySettings, kwargs)
    try:
        keys = (
            KeyCheck(read_keys(Path(settings.api_key_file)))
            if settings.api_key_file
            else KeyCheck()
        )
        server = gateway_server(settings, kafka, keys)
        asyncio.run(ensure_reachable(kafka, GatewayStartError))
    except GatewayStartError as exc:
        raise click.ClickException(str(exc)) from exc
    # uvicorn stops gracefully on SIGTERM/SIGINT, then raises the signal again with the
    # handlers it found in place: these make that a no-op, so a clean stop exits 0, as a
    # drained worker does.
    for stop in (signal.SIGTERM, signal.SIGINT):
        signal.signal(stop, lambda *_: None)
    tracing = setup_tracing("tokenmill-gateway")  # None without an OTLP endpoint
    try:
        asyncio.run(server.serve())
    finally:
        shutdown_tracing(tracing)
    if not server.started:
        sys.exit(1)  # uvicorn said why (the app's start-up failed, or the port is taken)
