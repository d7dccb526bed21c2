"""`ops.connection.options.connection_argv`: a connection handed to a child process as flags
and env vars comes back, parsed by `kafka_options`, as the same connection; no secret on the
command line."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from actors.kafka.connection import KafkaConnection
from ops.connection.options import connection_argv, kafka_connection, kafka_options

SECRET = "s3cret-Qz8-unlikely"


@click.command()
@kafka_options
def connect(**kwargs: Any) -> KafkaConnection:
    return kafka_connection(kwargs)


def _child(kafka: KafkaConnection) -> tuple[KafkaConnection, list[str]]:
    """What a child given `connection_argv(kafka)` makes of it, in an environment with no
    TOKENMILL_* variable but the secrets; and the argv it was given."""
    argv, env = connection_argv(kafka)
    cleared: dict[str, str | None] = {n: None for n in os.environ if n.startswith("TOKENMILL_")}
    result = CliRunner().invoke(connect, argv, env={**cleared, **env}, standalone_mode=False)
    if result.exception is not None:
        raise result.exception
    assert isinstance(result.return_value, KafkaConnection)
    return result.return_value, argv


def _files(tmp_path: Path, *names: str) -> list[str]:
    paths = []
    for name in names:
        (tmp_path / name).write_text("x")
        paths.append(str(tmp_path / name))
    return paths


def test_a_plaintext_connection_is_only_its_bootstrap() -> None:
    kafka = KafkaConnection("broker-1:9092,broker-2:9092")
    assert connection_argv(kafka) == (["--bootstrap-servers", "broker-1:9092,broker-2:9092"], {})
    assert _child(kafka)[0] == kafka


def test_scram_over_mtls_round_trips_with_secrets_only_in_the_env(tmp_path: Path) -> None:
    ca, cert, key = _files(tmp_path, "ca.pem", "cert.pem", "key.pem")
    kafka = KafkaConnection(
        "broker:9093",
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="svc",
        sasl_password=SECRET,
        ssl_ca_file=ca,
        ssl_cert_file=cert,
        ssl_key_file=key,
        ssl_key_password=SECRET + "-key",
        ssl_check_hostname=False,
        compression_type="zstd",
    )
    child, argv = _child(kafka)

    assert child == kafka
    assert "--no-ssl-check-hostname" in argv
    assert not any(SECRET in arg for arg in argv)
    assert connection_argv(kafka)[1] == {
        "TOKENMILL_SASL_PASSWORD": SECRET,
        "TOKENMILL_SSL_KEY_PASSWORD": SECRET + "-key",
    }


def test_oauthbearer_by_file_and_by_command(tmp_path: Path) -> None:
    (token,) = _files(tmp_path, "token")
    by_file = KafkaConnection(
        "b:9093", security_protocol="SASL_PLAINTEXT", sasl_mechanism="OAUTHBEARER",
        oauth_token_file=token,
    )  # fmt: skip
    command = f"get-token --client-secret {SECRET}"
    by_command = KafkaConnection(
        "b:9093", security_protocol="SASL_SSL", sasl_mechanism="OAUTHBEARER",
        oauth_token_command=command,
    )  # fmt: skip

    assert _child(by_file)[0] == by_file
    child, argv = _child(by_command)
    assert child == by_command
    assert not any(SECRET in arg for arg in argv)
    assert connection_argv(by_command)[1] == {"TOKENMILL_OAUTH_TOKEN_COMMAND": command}


def test_relative_paths_become_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    _files(tmp_path, "ca.pem")
    argv, _ = connection_argv(
        KafkaConnection("b:9093", security_protocol="SSL", ssl_ca_file="ca.pem")
    )
    assert argv[argv.index("--ssl-ca-file") + 1] == str(tmp_path / "ca.pem")
