"""`tokenmill worker`: serve generation requests from Kafka until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import structlog

from ops.models.engine_options import (
    EngineChoice,
    build_engine,
    engine_choice,
    worker_engine_options,
)
from ops.settings import build
from ops.worker.settings import WorkerCommand, worker_config, worker_options
from ops.worker.startup_signals import (
    StartupSignals,
    result_of,
    stopped_during_startup,
)

if TYPE_CHECKING:
    from actors.kafka.connection import KafkaConnection
    from ops.worker.echo_engine import EchoEngine


@click.command()
@worker_engine_options
@worker_options
def worker(**kwargs: Any) -> None:
    """Consume GenerateRequests from the requests topic and produce GenerateResults.

    Every record gets exactly one result (or an error result, plus the raw record on the DLQ
    when it cannot be decoded); offsets are committed only after results are acknowledged.
    SIGTERM or SIGINT drains: stop fetching, finish in-flight work within --shutdown-timeout-s,
    fail the rest with `shutting_down`, commit, exit 0. Every option can also come from a
    TOKENMILL_* env var or a --config TOML file. `--engine echo` runs no model (each result
    is its request's prompt tokens): it measures the plumbing's ceiling; never serve with it.
    SIGTERM or SIGINT while it is still starting (loading the model, say) exits 0 at once,
    logging `worker_stopped_during_startup`.
    """
    # Installed by `tokenmill`'s entry point already (ops/cli.py `main`); else now, before
    # anything slow: ops/worker/startup_signals.py.
    installed = click.get_current_context().find_object(StartupSignals)
    signals = installed or StartupSignals().install()
    try:
        _start_and_serve(kwargs, signals)
    except BaseException as error:
        stop = signals.stop_for(error)
        if stop is None:
            raise
        stopped_during_startup(stop)


def _start_and_serve(kwargs: dict[str, Any], signals: StartupSignals) -> None:
    from ops.worker.logging_setup import configure_logging

    command = build(WorkerCommand, kwargs)
    configure_logging(command.log_level)  # first: a stop during the imports is logged too

    from actors.engine_thread import engine_thread
    from actors.faults import Faults
    from actors.ingest.model_front import ModelFront
    from actors.telemetry.metrics import WorkerMetrics
    from actors.worker import Worker
    from gpu import host_heap
    from ops.worker.telemetry import setup_worker_tracing, shutdown_worker_tracing

    config = worker_config(kwargs)
    kind = command.engine
    choice = engine_choice(kwargs)
    try:
        faults = Faults.from_env()
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    _refuse_unusable_kafka(config.kafka)
    host_heap.keep_step_memory()  # weights map alone (swaps give them back), steps reuse

    def load() -> Any:
        with host_heap.loading_weights():
            if kind == "torch":
                return build_engine(choice, embeddings=True)
            return _echo_engine(choice)

    thread = engine_thread()  # the engine is built where it will be stepped
    loading = time.perf_counter()
    engine = result_of(thread.submit(load))  # what `build_on` does, with signals seen
    structlog.get_logger("tokenmill.worker").info(
        "model_loaded", model=choice.model, seconds=round(time.perf_counter() - loading, 3),
        phases=getattr(engine.model, "load_s", {}),  # the echo engine's model has none
    )  # fmt: skip
    try:
        service = Worker(
            config,
            engine,
            ModelFront.of_engine(engine),
            thread,
            build=_echo_builder(choice) if kind == "echo" else None,
            aliases=_registry_alias,
            faults=faults,
            metrics=WorkerMetrics(),
        )
    except ValueError as exc:  # a configuration that could make a result it cannot send
        raise click.ClickException(str(exc)) from exc
    del engine  # the worker's model holder owns it now; a swap must be able to free it
    tracing = setup_worker_tracing("tokenmill", instance_id=config.worker_id)
    try:
        asyncio.run(_serve(service, signals))
    finally:
        shutdown_worker_tracing(tracing)
    if service.engine_busy:  # a hung step: the interpreter's exit would join its thread forever
        _exit_now(service.exit_code or 1)
    if service.exit_code:
        raise SystemExit(service.exit_code)


def _exit_now(code: int) -> None:
    """End the process without joining threads; what was logged is flushed first."""
    import logging
    import os
    import sys

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _refuse_unusable_kafka(kafka: KafkaConnection) -> None:
    """Before the model loads: a setting that cannot work (bad credentials, an untrusted
    certificate) exits 1 at once with one line. A broker that is only away is waited for."""
    from actors.kafka.preflight import preflight

    reach = asyncio.run(preflight(kafka))
    if not reach.usable:
        structlog.get_logger("tokenmill.worker").error(
            "kafka_unusable", reason=reach.reason, **kafka.describe()
        )
        raise click.ClickException(f"kafka: {reach.reason}")


def _registry_alias(name: str) -> Path | None:
    """A registry alias's model file (fetched once into the cache), else None."""
    from ops.models.registry import REGISTRY, resolve_model

    return resolve_model(name) if name in REGISTRY else None


def _echo_builder(choice: EngineChoice) -> Callable[[Path], EchoEngine]:
    def build(path: Path) -> EchoEngine:
        from ops.worker.echo_engine import EchoEngine, load_echo_model

        return EchoEngine(load_echo_model(path), choice.engine)

    return build


def _echo_engine(choice: EngineChoice) -> EchoEngine:
    """The benchmark-only engine over the model's tokenizer and config; no weights are read."""
    import structlog

    from gpu.errors import EngineError
    from ops.errors import ModelFetchError
    from ops.models.registry import resolve_model
    from ops.worker.echo_engine import EchoEngine, load_echo_model

    try:
        model = load_echo_model(resolve_model(choice.model), name=choice.model)
        engine = EchoEngine(model, choice.engine)
    except (EngineError, ModelFetchError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    structlog.get_logger("tokenmill.worker").warning(
        "echo_engine_running", model=model.name, digest=model.digest, note="benchmark only"
    )
    return engine


async def _serve(service: Any, signals: StartupSignals) -> None:
    loop = asyncio.get_running_loop()
    signals.hand_to(loop, service.drain)
    try:
        await service.run()
    finally:
        signals.after_serving(loop)
