"""`tokenmill swap | rollback | drain | status` where no broker is needed: their refusals."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from ops.cli import cli

COMMANDS = [["status"], ["swap", "--model", "m"], ["rollback"], ["drain", "--yes"]]


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: a[0])
def test_a_missing_secret_is_a_usage_error(args: list[str]) -> None:
    done = CliRunner().invoke(cli, args, env={"TOKENMILL_CONTROL_SECRET": None})
    assert done.exit_code == 2, done.output
    assert "no control secret: set TOKENMILL_CONTROL_SECRET (or pass --secret)" in done.stderr


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: a[0])
def test_an_unreachable_broker_is_one_line(args: list[str]) -> None:
    done = CliRunner().invoke(
        cli,
        [*args, "--bootstrap-servers", "127.0.0.1:1"],
        env={"TOKENMILL_CONTROL_SECRET": "s"},
    )
    assert done.exit_code == 1, done.output
    assert done.stderr.startswith("Error: cannot reach Kafka at 127.0.0.1:1")
    assert len(done.stderr.strip().splitlines()) == 1
    assert "Traceback" not in done.output


def test_drain_asks_first() -> None:
    done = CliRunner().invoke(cli, ["drain"], input="n\n", env={"TOKENMILL_CONTROL_SECRET": "s"})
    assert done.exit_code == 1
    assert "Drain and stop every worker" in done.output and "Aborted" in done.stderr
