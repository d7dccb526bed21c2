"""`tokenmill worker`: serve generation requests from Kafka until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import signal
from typing import Any

import click

from ops.engine_options import build_engine, engine_choice, engine_options
from ops.settings import worker_config, worker_options


@click.command()
@engine_options
@worker_options
def worker(**kwargs: Any) -> None:
    """Consume GenerateRequests from the requests topic and produce GenerateResults.

    Every record gets exactly one result (or an error result, plus the raw record on the DLQ
    when it cannot be decoded); offsets are committed only after results are acknowledged.
    SIGTERM or SIGINT drains: stop fetching, finish in-flight work within --shutdown-timeout,
    fail the rest with `shutting_down`, commit, exit 0. Every option can also come from a
    TOKENMILL_* env var or a --config TOML file.
    """
    from actors.model_front import ModelFront
    from actors.worker import Worker
    from ops.logging_setup import configure_logging

    configure_logging(kwargs.pop("log_level"))
    config = worker_config(kwargs)
    engine = build_engine(engine_choice(kwargs))
    service = Worker(config, engine, ModelFront.of_engine(engine))
    asyncio.run(_serve(service))


async def _serve(service: Any) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, service.drain)
    await service.run()
