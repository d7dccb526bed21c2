"""The Kafka connection options every command takes, and the `KafkaConnection` they make.

    @kafka_options
    @click.command()
    def submit(**kwargs): kafka = kafka_connection(kwargs)

Each setting comes from its flag, else its `TOKENMILL_*` env var (or, for the worker, its TOML
file), else the client properties file (`--kafka-config`), else the default. A secret's option
(a field with `repr=False`) is a `SecretOption`: `--help` never shows its value, whatever gives
it (the worker's TOML file, an env var); a password is best given by file or env var (a flag
shows in `ps`).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
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
from ops.settings import build, options

log = structlog.get_logger("tokenmill.kafka")


@dataclass(frozen=True)
class KafkaOptions:
    """The connection as the command line gives it (`ops/settings.py` derives the options);
    None: not given, so the properties file, then `KafkaConnection`'s default, decide. A
    secret is a field with `repr=False`."""

    bootstrap_servers: str | None = field(
        default=None,
        metadata={
            "help": f"Kafka bootstrap addresses, comma-separated [default: {DEFAULT_BOOTSTRAP}].",
            "short": "-b",
        },
    )
    kafka_config: str | None = field(
        default=None,
        metadata={
            "help": "A Kafka client properties file (Java or librdkafka keys: "
            "bootstrap.servers, security.protocol, sasl.*, ssl.*); the options here override it.",
            "file": True,
        },
    )
    security_protocol: str | None = field(
        default=None, metadata={"help": "[default: PLAINTEXT]", "choices": SECURITY_PROTOCOLS}
    )
    sasl_mechanism: str | None = field(
        default=None, metadata={"help": "How the client authenticates.", "choices": SASL_MECHANISMS}
    )
    sasl_username: str | None = field(default=None, metadata={"help": "The SASL user name."})
    sasl_password: str | None = field(
        default=None,
        repr=False,
        metadata={
            "help": "Prefer TOKENMILL_SASL_PASSWORD or --sasl-password-file: a flag shows in `ps`."
        },
    )
    sasl_password_file: str | None = field(
        default=None, metadata={"help": "A file holding the SASL password.", "file": True}
    )
    oauth_token_file: str | None = field(
        default=None,
        metadata={"help": "OAUTHBEARER token, re-read when it changes.", "file": True},
    )
    oauth_token_command: str | None = field(
        default=None,
        repr=False,  # its arguments may hold a credential
        metadata={
            "help": "A command printing an OAUTHBEARER token; run again before the token expires."
        },
    )
    ssl_ca_file: str | None = field(
        default=None,
        metadata={"help": "CA certificates (PEM) [default: system trust store].", "file": True},
    )
    ssl_cert_file: str | None = field(
        default=None, metadata={"help": "Client certificate (PEM), for mTLS.", "file": True}
    )
    ssl_key_file: str | None = field(
        default=None, metadata={"help": "Client private key (PEM), for mTLS.", "file": True}
    )
    ssl_key_password: str | None = field(
        default=None,
        repr=False,
        metadata={"help": "Password of an encrypted client key (prefer the env var)."},
    )
    ssl_check_hostname: bool | None = field(
        default=None,
        metadata={"help": "Check that the broker's certificate names its host [default: on]."},
    )
    compression_type: str | None = field(
        default=None,
        metadata={
            "help": "Compression of what tokenmill produces [default: none].",
            "choices": COMPRESSION_TYPES,
        },
    )


kafka_options = options(KafkaOptions)  # adds the connection options to a click command


def kafka_connection(values: dict[str, Any]) -> KafkaConnection:
    """Pop the connection options out of a command's option values; a setting that cannot
    work is a usage error naming it (never its value)."""
    given = asdict(build(KafkaOptions, values))
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
    for name, value in given.items():
        if value is not None and name not in ("kafka_config", "sasl_password_file"):
            settings[name] = value
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
