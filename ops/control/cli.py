"""`tokenmill swap | rollback | drain | status`: signed commands to every worker, and answers.

Each command is signed with the fleet's shared secret and produced to the control topic; every
worker reading it answers on the events topic, naming the command. These commands print the
answers that arrive, one line (or table row) per worker.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Callable
from typing import Any

import click

from actors.config import DEFAULT_CONTROL_TOPIC, DEFAULT_EVENTS_TOPIC
from ops.connection.options import kafka_connection, kafka_options

_SETTLE_S = 2.0  # how long answers are collected without --wait, and at least with it


def _control_options(command: Callable[..., Any]) -> Callable[..., Any]:
    options = [
        kafka_options,
        click.option("--control-topic", default=DEFAULT_CONTROL_TOPIC, show_default=True),
        click.option("--events-topic", default=DEFAULT_EVENTS_TOPIC, show_default=True),
        click.option(
            "--secret",
            envvar="TOKENMILL_CONTROL_SECRET",
            default=None,
            show_envvar=True,
            help="The workers' shared control secret (better given by the env var).",
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def _wait_options(command: Callable[..., Any]) -> Callable[..., Any]:
    command = click.option(
        "--timeout",
        type=click.FloatRange(min=0, min_open=True),
        default=300.0,
        show_default=True,
        help="Seconds --wait waits for every worker to finish.",
    )(command)
    return click.option(
        "--wait", is_flag=True, help="Wait until every worker that answered has finished."
    )(command)


@click.command()
@_control_options
@click.option("--model", required=True, help="An alias or a path inside the models directory.")
@_wait_options
def swap(model: str, wait: bool, timeout: float, **common: Any) -> None:
    """Hot-swap every worker to MODEL: load it beside the active one, smoke-test, flip.

    Without --wait, prints which workers started swapping (answers within 2 s). With --wait,
    prints one line per worker once each has swapped, failed or refused: the models with
    short digests, the load, smoke-test and flip times, and any drain. Exits 1 when a worker
    failed or refused, or none answered in time.
    """
    from messages.control import SwapModel

    sys.exit(_change(SwapModel(model=model), wait, timeout, common))


@click.command()
@_control_options
@_wait_options
def rollback(wait: bool, timeout: float, **common: Any) -> None:
    """Flip every worker back to its previous model; prints and exits as `swap` does."""
    from messages.control import Rollback

    sys.exit(_change(Rollback(), wait, timeout, common))


@click.command()
@_control_options
@_wait_options
@click.confirmation_option(prompt="Drain and stop every worker reading this control topic?")
def drain(wait: bool, timeout: float, **common: Any) -> None:
    """Drain every worker: stop fetching, finish in-flight work, exit.

    With --wait, waits until each worker that answered reports it stopped.
    """
    from messages.control import Drain
    from messages.events import CommandRefused, WorkerStopped

    finals = (WorkerStopped, CommandRefused)
    events = _send(common, Drain(), *_collecting(wait, timeout, finals))
    for event in events:
        click.echo(_line(event))
    sys.exit(_exit_code(events, finals if wait else ()))


@click.command()
@_control_options
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=3.0,
    show_default=True,
    help="Seconds to collect answers.",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per worker.")
def status(timeout: float, as_json: bool, **common: Any) -> None:
    """Ask every worker for its status and print a table of the answers.

    Columns: worker, active model and short digest, standby model, uptime, queued and
    running requests, KV blocks used/total, draining, child restarts. Exits 1 when no
    worker answered within --timeout.
    """
    import msgspec

    from messages.control import Status
    from messages.events import CommandRefused, StatusReply

    events = _send(common, Status(), timeout, None)
    for event in events:
        if isinstance(event, CommandRefused):
            click.echo(_line(event), err=True)
    replies = {e.worker: e for e in events if isinstance(e, StatusReply)}
    if not replies:
        raise click.ClickException(
            f"no worker answered within {timeout:g} s on {common['control_topic']}"
        )
    if as_json:
        for worker in sorted(replies):
            click.echo(msgspec.json.encode(replies[worker]).decode())
    else:
        _print_status([replies[w] for w in sorted(replies)])


# -- sending -------------------------------------------------------------------------------


def _change(command: Any, wait: bool, timeout: float, common: dict[str, Any]) -> int:
    from messages.events import CommandRefused, ModelSwapFailed, ModelSwapped

    finals = (ModelSwapped, ModelSwapFailed, CommandRefused)
    events = _send(common, command, *_collecting(wait, timeout, finals))
    if not wait:
        for event in events:
            click.echo(_line(event))
        return _exit_code(events, ())
    by_worker: dict[str, list[Any]] = {}
    for event in events:
        by_worker.setdefault(event.worker, []).append(event)
    for worker in sorted(by_worker):
        final = next((e for e in by_worker[worker] if isinstance(e, finals)), None)
        if final is not None:
            click.echo(_line(final))
        else:
            last = _what(by_worker[worker][-1])
            click.echo(f"{worker}  unfinished after {timeout:g} s (last: {last})")
    return _exit_code(events, finals)


def _collecting(
    wait: bool, timeout: float, finals: tuple[type[Any], ...]
) -> tuple[float, Callable[[list[Any]], bool] | None]:
    """How long to collect answers: 2 s, or with `wait` until every worker that answered has
    sent one of `finals` (but at least 2 s, so slower workers are counted) or `timeout`."""
    if wait:
        return timeout, _all_final(finals)
    return _SETTLE_S, None


def _send(
    common: dict[str, Any],
    command: Any,
    wait_s: float,
    until: Callable[[list[Any]], bool] | None,
) -> list[Any]:
    """Send `command` and collect the answers (see `ops.control.client.send_command`)."""
    from ops.control.client import ControlError, send_command

    secret = common["secret"]
    if not secret:
        raise click.UsageError(
            "no control secret: set TOKENMILL_CONTROL_SECRET (or pass --secret) to the "
            "secret the workers were started with"
        )
    # aiokafka reports a refused connection through logging's last resort (stderr); the
    # ClickException below says the same in one line.
    kafka_log = logging.getLogger("aiokafka")
    if not kafka_log.handlers:
        kafka_log.addHandler(logging.NullHandler())
    try:
        return asyncio.run(
            send_command(
                kafka_connection(common),
                command,
                secret=secret,
                control_topic=common["control_topic"],
                events_topic=common["events_topic"],
                wait_s=wait_s,
                until=until,
            )
        )
    except ControlError as exc:
        raise click.ClickException(str(exc)) from None


def _all_final(finals: tuple[type[Any], ...]) -> Callable[[list[Any]], bool]:
    first_call: list[float] = []

    def done(events: list[Any]) -> bool:
        if not first_call:
            first_call.append(time.monotonic())
        if time.monotonic() - first_call[0] < _SETTLE_S:
            return False
        workers = {e.worker for e in events}
        finished = {e.worker for e in events if isinstance(e, finals)}
        return bool(workers) and workers <= finished

    return done


def _exit_code(events: list[Any], finals: tuple[type[Any], ...]) -> int:
    """1 when nobody answered, someone failed or refused, or (with `finals`) is unfinished."""
    from messages.events import CommandRefused, ModelSwapFailed

    if not events:
        click.echo("no worker answered (is one running, reading this control topic?)", err=True)
        return 1
    if any(isinstance(e, CommandRefused | ModelSwapFailed) for e in events):
        return 1
    if finals:
        workers = {e.worker for e in events}
        return 0 if workers <= {e.worker for e in events if isinstance(e, finals)} else 1
    return 0


# -- printing ------------------------------------------------------------------------------


def _line(event: Any) -> str:
    """One line for people about one answering event."""
    return f"{event.worker}  {_what(event)}"


def _what(event: Any) -> str:
    from messages import events as ev

    match event:
        case ev.ModelSwapStarted():
            what = f"swapping  {_ref(event.from_model)} → {event.to_model}"
        case ev.ModelSwapped():
            what = (
                f"swapped  {_ref(event.from_model)} → {_ref(event.to_model)}  "
                f"load {event.load_ms:.0f} ms, smoke {event.smoke_ms:.0f} ms, "
                f"flip {event.flip_ms:.0f} ms"
            )
            if event.drained:
                what += f", drained first (paused {event.pause_ms:.0f} ms)"
        case ev.ModelSwapFailed():
            what = f"failed  → {event.to_model}: {event.reason}"
        case ev.CommandRefused():
            what = f"refused  {event.reason}"
        case ev.WorkerDraining():
            what = f"draining  {event.in_flight} in flight ({event.reason})"
        case ev.WorkerStopped():
            what = f"stopped  answered {event.answered}, failed {event.failed_on_shutdown}"
        case _:
            what = type(event).__name__
    return what


def _ref(model: Any) -> str:
    return f"{model.name}@{_short(model.digest)}"


def _short(digest: str) -> str:
    """The digest cut to 12 hex digits, its prefix kept (sha256:80d8645cdd0e)."""
    prefix, _, hexdigest = digest.rpartition(":")
    return f"{prefix}:{hexdigest[:12]}" if prefix else hexdigest[:12]


def _print_status(replies: list[Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{len(replies)} worker(s)")
    for column in ("worker", "model", "digest", "standby", "uptime", "queued", "running"):
        table.add_column(column, justify="right" if column in ("queued", "running") else "left")
    for column in ("KV used/total", "draining", "restarts"):
        table.add_column(column, justify="right")
    for r in replies:
        total = r.kv_blocks_total
        share = f" ({100 * r.kv_blocks_used / total:.0f}%)" if total else ""
        table.add_row(
            r.worker,
            r.model.name,
            _short(r.model.digest),
            _ref(r.standby) if r.standby is not None else "-",
            _duration(r.uptime_s),
            str(r.queued),
            str(r.running),
            f"{r.kv_blocks_used}/{total}{share}",
            "yes" if r.draining else "no",
            str(r.restarts),
        )
    console = Console()
    if not console.is_terminal:  # a log or a pipe: no width to fit, keep each row whole
        console = Console(width=200)
    console.print(table)


def _duration(seconds: float) -> str:
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"
