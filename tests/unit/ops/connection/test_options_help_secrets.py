"""`--help` never shows a secret (ops/connection/options.py `SecretOption`): not from the
worker's `--config` TOML file, not from an env var, not as a default, for every option whose
name says it holds one."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from ops.cli import cli
from ops.settings import SecretOption

# Options that hold a secret: a secret, a password or a token (not a count of tokens); less
# those that name a file holding one (a path is no secret).
SECRET_NAME = re.compile(r"secret|password|token(?!s)")
KNOWN = {"control_secret", "sasl_password", "ssl_key_password", "oauth_token_command"}


def secret_options(command: click.Command) -> list[click.Option]:
    return [
        param
        for param in command.params
        if isinstance(param, click.Option)
        and param.name
        and SECRET_NAME.search(param.name)
        and not param.name.endswith("_file")
    ]


def commands() -> dict[str, click.Command]:
    """Every command of `tokenmill`, imported (the group imports each only when asked)."""
    ctx = click.Context(cli)
    found = {name: cli.get_command(ctx, name) for name in cli.list_commands(ctx)}
    return {name: command for name, command in found.items() if command is not None}


def envvar_of(option: click.Option) -> str:
    assert isinstance(option.envvar, str), option.name
    return option.envvar


def all_env_unset() -> dict[str, str | None]:
    """Every option's variable unset, so the shell running the tests cannot leak in."""
    return {
        option.envvar: None
        for command in commands().values()
        for option in command.params
        if isinstance(option, click.Option) and isinstance(option.envvar, str)
    }


def test_every_secret_option_of_the_worker_is_masked() -> None:
    secrets = secret_options(commands()["worker"])
    assert {option.name for option in secrets} >= KNOWN  # the grep finds what it must
    for option in secrets:
        assert isinstance(option, SecretOption), option.name


@pytest.mark.parametrize("table", ["", "[worker]\n"])
def test_worker_help_shows_no_secret_from_the_config_file_or_the_env(
    tmp_path: Path, table: str
) -> None:
    secrets = secret_options(commands()["worker"])
    from_file = {option.name: f"file-secret-{option.name}" for option in secrets}
    config = tmp_path / "tokenmill.toml"
    config.write_text(table + "".join(f'{name} = "{value}"\n' for name, value in from_file.items()))

    result = CliRunner().invoke(cli, ["worker", "--config", str(config), "--help"],
                                env=all_env_unset())  # fmt: skip

    assert result.exit_code == 0, result.output
    for value in from_file.values():
        assert value not in result.output
    assert result.output.count("(set)") == len(secrets)  # said to be set, never what to

    env = {envvar_of(option): f"env-secret-{option.name}" for option in secrets}
    result = CliRunner().invoke(cli, ["worker", "--help"], env={**all_env_unset(), **env})

    assert result.exit_code == 0, result.output
    for value in env.values():
        assert value not in result.output
    assert result.output.count("(set)") == len(secrets)


def test_an_unset_secret_shows_nothing() -> None:
    result = CliRunner().invoke(cli, ["worker", "--help"], env=all_env_unset())
    assert result.exit_code == 0, result.output
    assert "(set)" not in result.output


@pytest.mark.parametrize(
    "name", sorted(name for name, command in commands().items() if secret_options(command))
)
def test_no_commands_help_shows_a_secret_from_the_env(name: str) -> None:
    command = commands()[name]
    env = {envvar_of(option): f"env-secret-{option.name}" for option in secret_options(command)}

    result = CliRunner().invoke(cli, [name, "--help"], env={**all_env_unset(), **env})

    assert result.exit_code == 0, result.output
    for value in env.values():
        assert value not in result.output


def test_a_secret_option_shows_no_default_even_when_defaults_are_shown() -> None:
    @click.command()
    @click.option("--token", cls=SecretOption, default="given-default", show_default=True)
    @click.option("--plain", default="shown", show_default=True)
    def command(token: str, plain: str) -> None:
        """A command."""

    result = CliRunner().invoke(command, ["--help"], default_map={"token": "from-a-file"})

    assert result.exit_code == 0, result.output
    assert "given-default" not in result.output and "from-a-file" not in result.output
    assert "(set)" in result.output and "shown" in result.output
