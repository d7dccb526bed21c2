"""What the `tokenmill bench` commands share: option decorators, the broker to use, running a
bench to its report and showing it (`ops/bench/cli.py` holds the commands)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

import click

from actors.kafka.connection import KafkaConnection
from ops.connection.options import kafka_connection
from ops.errors import OpsError

F = Callable[..., Any]
_NOT_GIVEN = KafkaConnection()
POSITIVE = click.FloatRange(min=0, min_open=True)


def int_option(name: str, default: int, text: str, low: int = 1) -> Callable[[F], F]:
    kind = click.IntRange(min=low)
    return click.option(name, type=kind, default=default, show_default=True, help=text)


def option(*decls: str, text: str, **kw: Any) -> Callable[[F], F]:
    return click.option(*decls, show_default="default" in kw, help=text, **kw)


def options(*decorators: Callable[[F], F]) -> Callable[[F], F]:
    def apply(command: F) -> F:
        for decorator in reversed(decorators):
            command = decorator(command)
        return command

    return apply


report_options = options(
    option("--json", "as_json", is_flag=True, text="Print the full report as JSON."),
    option("--out", type=click.Path(path_type=Path), text="Also write the JSON report here (a "
         "folder: <date>-<bench>-<host>.json in it; the project keeps its own in docs/results)."),
)  # fmt: skip
workload_options = options(  # the seeded workload, the same for engine and pipeline
    int_option("--requests", 64, "Requests in the (throughput) workload."),
    int_option("--seed", 0, "Seeds the workload.", low=0),
    int_option("--min-prompt", 16, "Shortest prompt, in tokens."),
    int_option("--max-prompt", 256, "Longest prompt, in tokens."),
    int_option("--min-output", 16, "Shortest output, in tokens."),
    int_option("--max-output", 256, "Longest output, in tokens."),
)


def given(cls: Any, kwargs: dict[str, Any], **more: Any) -> Any:
    """`cls` (a dataclass) from the options named as its fields, and `more`."""
    return cls(**{f.name: kwargs[f.name] for f in fields(cls) if f.name in kwargs} | more)


def workload(kwargs: dict[str, Any]) -> Any:
    from ops.bench.workload import Workload

    return given(Workload, kwargs)


def bench_kafka(kwargs: dict[str, Any]) -> KafkaConnection | None:
    """The broker given (`--bootstrap-servers` or `--kafka-config`) with the other connection
    options; None: start one for the run (other connection options are then a usage error)."""
    given = kwargs["bootstrap_servers"] is not None or kwargs["kafka_config"] is not None
    kafka = kafka_connection(kwargs)  # takes the connection options out of kwargs
    if given:
        return kafka
    stray = [f.name for f in fields(kafka) if getattr(kafka, f.name) != getattr(_NOT_GIVEN, f.name)]
    if stray:
        raise click.UsageError(
            f"{', '.join(stray)} given without --bootstrap-servers or --kafka-config: "
            "without them the bench starts its own plaintext broker"
        )
    return None


def say(line: str) -> None:
    click.echo(line, err=True)


def run(make: Callable[[], Any]) -> Any:
    """`make()` (run to its end if a coroutine); its errors as click errors."""
    from gpu.errors import EngineError

    try:
        made = make()
        return asyncio.run(made) if asyncio.iscoroutine(made) else made
    except (ValueError, RuntimeError, OpsError, EngineError) as exc:
        raise click.ClickException(str(exc)) from exc


def show(report: Any, kwargs: dict[str, Any]) -> None:
    """The report as text or JSON on stdout, and into `--out`."""
    click.echo(report.json() if kwargs["as_json"] else report.text())
    if kwargs["out"] is not None:
        say(f"report written to {report.write(kwargs['out'])}")
