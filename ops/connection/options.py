"""The Kafka connection options every command takes, and the `KafkaConnection` they make.

    @kafka_options
    @click.command()
    def submit(**kwargs): kafka = kafka_connection(kwargs)

Each setting comes from its flag, else its `TOKENMILL_*` env var (or, for the worker, its TOML
file), else the client properties file (`--kafka-config`), else the default. A secret's option
is a `SecretOption`: `--help` never shows its value, whatever gives it (the worker's TOML file,
an env var); a password is best given by file or env var (a flag shows in `ps`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import structlog

from actors.kafka.connection import (
    COMPRESSION_TYPES,
    DEFAULT_BOOTSTRAP,
    SASL_MECHANISMS,
    SECURITY_PROTOCOLS,
    KafkaConnection,
)
from actors.kafka.errors import KafkaSettingError
from ops.connection.properties import read_properties

log = structlog.get_logger("tokenmill.kafka")

_FIELDS = (
    "bootstrap_servers",
    "security_protocol",
    "sasl_mechanism",
    "sasl_username",
    "sasl_password",
    "oauth_token_file",
    "oauth_token_command",
    "ssl_ca_file",
    "ssl_cert_file",
    "ssl_key_file",
    "ssl_key_password",
    "ssl_check_hostname",
    "compression_type",
)
_OPTION_NAMES = (*_FIELDS, "kafka_config", "sasl_password_file")


class SecretOption(click.Option):
    """An option whose value is a secret. `--help` shows `(set)` where another option shows
    its default, when a default, the worker's TOML file or the env var gives one; never the
    value. Declare every secret with `cls=SecretOption`."""

    def get_help_extra(self, ctx: click.Context) -> click.types.OptionHelpExtra:
        extra = super().get_help_extra(ctx)
        extra.pop("default", None)
        if self.get_default(ctx, call=False) or self.resolve_envvar_value(ctx):
            extra["default"] = "(set)"
        return extra


def _opt(*decls: str, **kwargs: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    name = decls[0].split("/")[0]
    kwargs.setdefault("envvar", "TOKENMILL_" + name.lstrip("-").replace("-", "_").upper())
    kwargs.setdefault("default", None)
    return click.option(*decls, show_envvar=True, **kwargs)


_FILE = click.Path(exists=True, dir_okay=False)
_OPTIONS: list[Callable[[Callable[..., Any]], Callable[..., Any]]] = [
    _opt(
        "--bootstrap-servers",
        "-b",
        help=f"Kafka bootstrap addresses, comma-separated [default: {DEFAULT_BOOTSTRAP}].",
    ),
    _opt(
        "--kafka-config",
        type=_FILE,
        help="A Kafka client properties file (Java or librdkafka keys: bootstrap.servers, "
        "security.protocol, sasl.*, ssl.*); the options here override it.",
    ),
    _opt(
        "--security-protocol",
        type=click.Choice(SECURITY_PROTOCOLS, case_sensitive=False),
        help="[default: PLAINTEXT]",
    ),
    _opt("--sasl-mechanism", type=click.Choice(SASL_MECHANISMS, case_sensitive=False)),
    _opt("--sasl-username"),
    _opt(
        "--sasl-password",
        cls=SecretOption,
        help="Prefer TOKENMILL_SASL_PASSWORD or --sasl-password-file: a flag shows in `ps`.",
    ),
    _opt("--sasl-password-file", type=_FILE, help="A file holding the SASL password."),
    _opt("--oauth-token-file", type=_FILE, help="OAUTHBEARER token, re-read when it changes."),
    _opt(
        "--oauth-token-command",
        cls=SecretOption,  # its arguments may hold a credential
        help="A command printing an OAUTHBEARER token; run again before the token expires.",
    ),
    _opt("--ssl-ca-file", type=_FILE, help="CA certificates (PEM) [default: system trust store]."),
    _opt("--ssl-cert-file", type=_FILE, help="Client certificate (PEM), for mTLS."),
    _opt("--ssl-key-file", type=_FILE, help="Client private key (PEM), for mTLS."),
    _opt(
        "--ssl-key-password",
        cls=SecretOption,
        help="Password of an encrypted client key (prefer the env var).",
    ),
    _opt(
        "--ssl-check-hostname/--no-ssl-check-hostname",
        help="Check that the broker's certificate names its host [default: on].",
    ),
    _opt(
        "--compression-type",
        type=click.Choice(COMPRESSION_TYPES, case_sensitive=False),
        help="Compression of what tokenmill produces [default: none].",
    ),
]


def kafka_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add the connection options to a click command (see `kafka_connection`)."""
    for option in reversed(_OPTIONS):
        command = option(command)
    return command


def kafka_connection(kwargs: dict[str, Any]) -> KafkaConnection:
    """Pop the connection options out of a command's kwargs; a setting that cannot work is a
    usage error naming it (never its value)."""
    given = {name: kwargs.pop(name, None) for name in _OPTION_NAMES}
    ctx = click.get_current_context(silent=True)
    # The password flag beats the file; the file beats TOKENMILL_SASL_PASSWORD (or TOML).
    if (
        ctx is not None
        and given["sasl_password_file"]
        and given["sasl_password"] is not None
        and ctx.get_parameter_source("sasl_password") != click.core.ParameterSource.COMMANDLINE
    ):
        given["sasl_password"] = None
    try:
        return connection_from(given)
    except KafkaSettingError as exc:
        raise click.UsageError(str(exc)) from exc


def connection_from(given: dict[str, Any]) -> KafkaConnection:
    """A `KafkaConnection` from option values (None: not given), over the properties file of
    `kafka_config` if any. `KafkaSettingError` when they cannot work together."""
    settings: dict[str, object] = {}
    if given.get("kafka_config"):
        properties = read_properties(Path(given["kafka_config"]))
        settings.update(properties.settings)
        if properties.unused:
            log.warning(
                "kafka_config_keys_unused",
                path=str(properties.path),
                keys=list(properties.unused),
                note="tokenmill sets these itself or does not need them",
            )
    if given.get("sasl_password_file"):
        settings["sasl_password"] = _read_secret(Path(given["sasl_password_file"]))
    for name in _FIELDS:
        if given.get(name) is not None:
            settings[name] = given[name]
    if isinstance(settings.get("compression_type"), str):
        settings["compression_type"] = str(settings["compression_type"]).lower()
    return KafkaConnection(**settings)  # type: ignore[arg-type]


def connection_argv(kafka: KafkaConnection) -> tuple[list[str], dict[str, str]]:
    """The flags and env vars that give a `kafka_options` command in a child process this
    same connection: flags for every setting off its default (always `--bootstrap-servers`,
    and file paths made absolute, for a child in another directory), env vars for the secrets,
    which never go on a command line (it shows in `ps`). Merge the env into the child's."""
    default = KafkaConnection()
    argv = ["--bootstrap-servers", kafka.bootstrap_servers]
    for name in ("security_protocol", "sasl_mechanism", "sasl_username", "compression_type"):
        value = getattr(kafka, name)
        if value != getattr(default, name):
            argv += [_flag(name), value]
    for name in ("oauth_token_file", "ssl_ca_file", "ssl_cert_file", "ssl_key_file"):
        if path := getattr(kafka, name):
            argv += [_flag(name), os.path.abspath(path)]
    if not kafka.ssl_check_hostname:
        argv.append("--no-ssl-check-hostname")
    secrets = {
        "TOKENMILL_SASL_PASSWORD": kafka.sasl_password,
        "TOKENMILL_SSL_KEY_PASSWORD": kafka.ssl_key_password,
        "TOKENMILL_OAUTH_TOKEN_COMMAND": kafka.oauth_token_command,
    }
    return argv, {name: value for name, value in secrets.items() if value is not None}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _read_secret(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError as exc:
        raise KafkaSettingError(f"cannot read the password file {path}: {exc.strerror}") from exc
