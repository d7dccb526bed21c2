"""`tokenmill`: the operator's command line.

Each command family lives in a sub-package of its own (`ops/<family>/cli.py`); this file only
assembles the group, and imports a command's module only when that command runs: importing
every family took ~0.7 s, during which a SIGTERM killed a starting worker (exit 143). The
group's `--help` lists every command from the summaries kept here, importing none of them.

`main()` is the console script (pyproject.toml) and `python -m ops`. For `tokenmill worker`
it installs the worker's start-up signal handler first of all (ops/worker/startup_signals.py):
a SIGTERM or SIGINT from then on, while the command's module is still being imported, exits 0
with `worker_stopped_during_startup`. Only the interpreter's own start and this module's
import (click) come before it.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import click

from ops.worker.startup_signals import StartupSignals, stopped_during_startup


class LazyCommand(NamedTuple):
    """Where a command is (`module:attribute`), and its docstring's first sentence."""

    target: str
    summary: str


COMMANDS: Mapping[str, LazyCommand] = {
    "batch": LazyCommand(
        "ops.batch.cli:batch", "Offline generation and embedding from OpenAI Batch API JSONL files."
    ),
    "bench": LazyCommand(
        "ops.bench.cli:bench",
        "Benchmarks; each prints one JSON document with --json and writes it with --out.",
    ),
    "cancel": LazyCommand("ops.cancel.cli:cancel", "Cancel the requests with these ids."),
    "down": LazyCommand(
        "ops.services.cli:down",
        "Stop what `tokenmill up` started: the broker (SIGTERM, then SIGKILL after 20 s) and "
        "Jaeger when it runs.",
    ),
    "drain": LazyCommand(
        "ops.control.cli:drain", "Drain every worker: stop fetching, finish in-flight work, exit."
    ),
    "gateway": LazyCommand(
        "ops.gateway.cli:gateway",
        "Serve OpenAI's HTTP API (completions, chat completions, models, files and batches) "
        "onto the Kafka fleet.",
    ),
    "generate": LazyCommand(
        "ops.models.generate_cli:generate",
        "Run prompts through the engine in one continuous batch and print the outputs.",
    ),
    "models": LazyCommand(
        "ops.models.cli:models", "Known model aliases and the local model cache."
    ),
    "plan": LazyCommand(
        "ops.models.plan_cli:plan",
        "Plan memory before deploying: weights + KV cache + activation reserve vs the budget.",
    ),
    "quantize": LazyCommand(
        "ops.quant.cli:quantize",
        "Quantize MODEL (an alias, an HF folder or a .gguf) to int8 or int4 and write a "
        "safetensors checkpoint tokenmill serves with `--quantization auto`.",
    ),
    "rollback": LazyCommand(
        "ops.control.cli:rollback",
        "Flip every worker back to its previous model; prints and exits as `swap` does.",
    ),
    "status": LazyCommand(
        "ops.control.cli:status",
        "Ask every worker for its status and print a table of the answers.",
    ),
    "submit": LazyCommand(
        "ops.submit.cli:submit",
        "Produce generation requests: a PROMPT, or every line of --file.",
    ),
    "swap": LazyCommand(
        "ops.control.cli:swap",
        "Hot-swap every worker to MODEL: load it beside the active one, smoke-test, flip.",
    ),
    "topics": LazyCommand(
        "ops.services.topics_cli:topics",
        "tokenmill's Kafka topics: requests, results, dlq, control, events, cancel.",
    ),
    "trace": LazyCommand(
        "ops.trace.cli:trace",
        "Print the trace of REQUEST_ID (or of a 32-hex trace id) as an indented span tree.",
    ),
    "up": LazyCommand(
        "ops.services.cli:up",
        "Start a single-node Kafka broker (KRaft) and print its bootstrap address.",
    ),
    "worker": LazyCommand(
        "ops.worker.cli:worker",
        "Consume GenerateRequests from the requests topic and produce GenerateResults.",
    ),
}


class LazyGroup(click.Group):
    """A group whose commands are imported when first asked for (`get_command`), from
    `lazy`: name → `LazyCommand`. Its own `--help` shows their summaries instead, so listing
    them imports nothing (tests/unit/test_cli.py checks each summary against the command's)."""

    def __init__(self, *args: Any, lazy: Mapping[str, LazyCommand], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = dict(lazy)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.commands or cmd_name not in self.lazy:
            return super().get_command(ctx, cmd_name)
        module, _, attribute = self.lazy[cmd_name].target.partition(":")
        command = getattr(importlib.import_module(module), attribute)
        if not isinstance(command, click.Command):
            raise TypeError(f"{self.lazy[cmd_name].target} is not a click command")
        self.add_command(command, cmd_name)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """As click's, with the summaries of the commands not imported yet."""
        names = self.list_commands(ctx)
        if not names:
            return
        limit = formatter.width - 6 - max(len(name) for name in names)
        rows = []
        for name in names:
            # One not imported yet: a stand-in with its summary, shortened as click does.
            command = self.commands.get(name) or click.Command(name, help=self.lazy[name].summary)
            if not command.hidden:
                rows.append((name, command.get_short_help_str(limit)))
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, lazy=COMMANDS, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="tokenmill")
def cli() -> None:
    """tokenmill: LLM generation jobs from Kafka topics, on an engine of its own."""


def invoked(args: Sequence[str]) -> str | None:
    """The command `args` name: the first that is not an option, since every option of the
    group itself is a flag (`--version`, `--help`); None when there is none."""
    return next((arg for arg in args if not arg.startswith("-")), None)


def main() -> None:
    if invoked(sys.argv[1:]) != "worker":
        cli()
        return
    signals = StartupSignals().install()  # the worker command takes it over (`find_object`)
    try:
        cli(obj=signals)
    except BaseException as error:  # before the command ran: while importing it, say
        stop = signals.stop_for(error)
        if stop is None:
            raise
        stopped_during_startup(stop)
