"""The `tokenmill` group (ops/cli.py): it imports a command's module only when that command
runs, its `--help` lists every command from the summaries it keeps, and those summaries are
the commands' own."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest

from ops.cli import COMMANDS, cli, invoked

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_summary_is_the_commands_own(name: str) -> None:
    module, _, attribute = COMMANDS[name].target.partition(":")
    command = getattr(importlib.import_module(module), attribute)
    assert isinstance(command, click.Command)
    assert command.get_short_help_str(limit=10_000) == COMMANDS[name].summary


def test_the_help_lists_every_command_and_imports_none() -> None:
    """In a fresh interpreter: what `tokenmill --help` prints, and which command modules it
    imported on the way (none)."""
    code = (
        "import json, sys\n"
        "from ops.cli import cli\n"
        "try:\n"
        "    cli(['--help'], prog_name='tokenmill', max_content_width=200)\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('ops.'))))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    *help_lines, loaded = done.stdout.splitlines()
    listed = help_lines[help_lines.index("Commands:") + 1 :]
    assert {line.split()[0] for line in listed} == set(COMMANDS)
    for line in listed:
        name = line.split()[0]
        assert line.split(None, 1)[1] == COMMANDS[name].summary
    commands = {target.target.partition(":")[0] for target in COMMANDS.values()}
    assert commands.isdisjoint(json.loads(loaded)), json.loads(loaded)


def test_a_command_is_imported_when_asked_for() -> None:
    ctx = click.Context(cli)
    assert cli.list_commands(ctx) == sorted(COMMANDS)
    worker = cli.get_command(ctx, "worker")
    assert isinstance(worker, click.Command) and worker.name == "worker"
    assert cli.get_command(ctx, "no-such-command") is None


def test_the_command_invoked_is_the_first_argument_not_an_option() -> None:
    assert all(isinstance(p, click.Option) and p.is_flag for p in cli.params)  # no values
    assert invoked(["worker", "--model", "x"]) == "worker"
    assert invoked(["--version"]) is None and invoked([]) is None
    assert invoked(["-h", "submit", "worker"]) == "submit"
