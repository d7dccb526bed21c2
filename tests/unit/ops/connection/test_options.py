"""`ops.connection.options`: the Kafka connection options every command takes, and their
precedence: flag or `TOKENMILL_*` env var, over the properties file, over the default."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner
from structlog.testing import capture_logs

from actors.kafka.connection import KafkaConnection
from ops.connection.options import kafka_connection, kafka_options

SECRET = "topsecret"
FILE_SECRET = "file-secret-Lp3-unlikely"

CONFLUENT = """\
bootstrap.servers=pkc-abc12.confluent.cloud:9092
security.protocol=SASL_SSL
sasl.mechanisms=PLAIN
sasl.username=KEY
sasl.password={password}
session.timeout.ms=45000
client.id=ccloud-client
"""


@click.command()
@kafka_options
def connect(**kwargs: Any) -> KafkaConnection:
    kafka = kafka_connection(kwargs)
    assert kwargs == {}  # every connection option was taken
    return kafka


def _clean_env(**env: str) -> dict[str, str | None]:
    """`env` over an environment with no TOKENMILL_* variable."""
    cleared: dict[str, str | None] = {
        name: None for name in os.environ if name.startswith("TOKENMILL_")
    }
    for param in connect.params:
        if isinstance(param.envvar, str):
            cleared[param.envvar] = None
    return {**cleared, **env}


def _run(args: list[str], **env: str) -> KafkaConnection:
    result = CliRunner().invoke(connect, args, env=_clean_env(**env), standalone_mode=False)
    if result.exception is not None:
        raise result.exception
    assert isinstance(result.return_value, KafkaConnection)
    return result.return_value


def _config(tmp_path: Path, password: str = FILE_SECRET) -> Path:
    path = tmp_path / "client.properties"
    path.write_text(CONFLUENT.format(password=password))
    return path


def test_no_option_is_the_default_connection() -> None:
    assert _run([]) == KafkaConnection()


def test_flags_make_the_connection() -> None:
    kafka = _run(
        ["-b", "b1:9093", "--security-protocol", "sasl_ssl", "--sasl-mechanism", "scram-sha-256",
         "--sasl-username", "svc", "--sasl-password", SECRET, "--compression-type", "ZSTD"]
    )  # fmt: skip

    assert kafka == KafkaConnection(
        "b1:9093", security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-256",
        sasl_username="svc", sasl_password=SECRET, compression_type="zstd",
    )  # fmt: skip


def test_the_properties_file_is_used(tmp_path: Path) -> None:
    kafka = _run(["--kafka-config", str(_config(tmp_path))])

    assert kafka == KafkaConnection(
        "pkc-abc12.confluent.cloud:9092", security_protocol="SASL_SSL", sasl_mechanism="PLAIN",
        sasl_username="KEY", sasl_password=FILE_SECRET,
    )  # fmt: skip


def test_the_properties_file_may_come_from_the_env(tmp_path: Path) -> None:
    kafka = _run([], TOKENMILL_KAFKA_CONFIG=str(_config(tmp_path)))

    assert kafka.sasl_username == "KEY"


def test_a_flag_overrides_the_file(tmp_path: Path) -> None:
    kafka = _run(
        ["--kafka-config", str(_config(tmp_path)), "-b", "override:9092",
         "--sasl-username", "other"]
    )  # fmt: skip

    assert kafka.bootstrap_servers == "override:9092"
    assert kafka.sasl_username == "other"
    assert kafka.sasl_password == FILE_SECRET
    assert kafka.sasl_mechanism == "PLAIN"


def test_an_env_var_overrides_the_file(tmp_path: Path) -> None:
    kafka = _run(["--kafka-config", str(_config(tmp_path))], TOKENMILL_SASL_PASSWORD=SECRET)

    assert kafka.sasl_password == SECRET


def test_a_password_file(tmp_path: Path) -> None:
    password = tmp_path / "password"
    password.write_text(f"{SECRET}\n")

    kafka = _run(["--kafka-config", str(_config(tmp_path)), "--sasl-password-file", str(password)])

    assert kafka.sasl_password == SECRET


def test_a_password_flag_overrides_the_password_file(tmp_path: Path) -> None:
    password = tmp_path / "password"
    password.write_text(FILE_SECRET)

    kafka = _run(
        ["--kafka-config", str(_config(tmp_path, "p")), "--sasl-password-file", str(password),
         "--sasl-password", SECRET]
    )  # fmt: skip

    assert kafka.sasl_password == SECRET


def test_the_hostname_check_flag_overrides_the_file(tmp_path: Path) -> None:
    config = tmp_path / "client.properties"
    config.write_text("security.protocol=SSL\nssl.endpoint.identification.algorithm=\n")

    assert _run(["--kafka-config", str(config)]).ssl_check_hostname is False
    assert _run(["--kafka-config", str(config), "--ssl-check-hostname"]).ssl_check_hostname
    assert _run(["--no-ssl-check-hostname"]).ssl_check_hostname is False
    assert _run([]).ssl_check_hostname is True


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--security-protocol", "SASL_SSL", "--sasl-password", SECRET], "sasl_mechanism"),
        (["--sasl-mechanism", "PLAIN", "--sasl-username", "u", "--sasl-password", SECRET],
         "security_protocol"),
        (["--security-protocol", "SASL_SSL", "--sasl-mechanism", "SCRAM-SHA-512",
          "--sasl-password", SECRET], "sasl_username"),
        (["--security-protocol", "SASL_SSL", "--sasl-mechanism", "OAUTHBEARER",
          "--sasl-password", SECRET], "oauth_token_file"),
    ],
)  # fmt: skip
def test_a_bad_combination_is_a_usage_error_naming_the_setting(args: list[str], named: str) -> None:
    with pytest.raises(click.UsageError, match=named) as raised:
        _run(args)

    assert SECRET not in str(raised.value)


def test_a_bad_combination_from_the_env_quotes_no_secret(tmp_path: Path) -> None:
    with pytest.raises(click.UsageError, match="security_protocol") as raised:
        _run(
            ["--kafka-config", str(_config(tmp_path)), "--security-protocol", "PLAINTEXT"],
            TOKENMILL_SASL_PASSWORD=SECRET,
        )

    assert SECRET not in str(raised.value)
    assert FILE_SECRET not in str(raised.value)


def test_an_unhonoured_file_key_is_a_usage_error(tmp_path: Path) -> None:
    config = tmp_path / "client.properties"
    config.write_text("ssl.keystore.location=/x.jks\nssl.keystore.password=ks-secret\n")

    with pytest.raises(click.UsageError, match=r"ssl\.keystore\.location") as raised:
        _run(["--kafka-config", str(config)])

    assert "ks-secret" not in str(raised.value)


def test_help_shows_no_secret() -> None:
    env = _clean_env(
        TOKENMILL_SASL_PASSWORD=SECRET,
        TOKENMILL_SSL_KEY_PASSWORD=FILE_SECRET,
        TOKENMILL_SASL_USERNAME="svc-user-unlikely",
    )

    result = CliRunner().invoke(connect, ["--help"], env=env)

    assert result.exit_code == 0
    assert "--sasl-password" in result.output
    assert "TOKENMILL_SASL_PASSWORD" in result.output
    assert SECRET not in result.output
    assert FILE_SECRET not in result.output
    assert "svc-user-unlikely" not in result.output


def test_unused_file_keys_are_warned_of_once(tmp_path: Path) -> None:
    config = _config(tmp_path)

    with capture_logs() as logs:
        _run(["--kafka-config", str(config)])

    unused = [entry for entry in logs if entry["event"] == "kafka_config_keys_unused"]
    assert len(unused) == 1
    assert unused[0]["log_level"] == "warning"
    assert unused[0]["keys"] == ["session.timeout.ms", "client.id"]
    assert unused[0]["path"] == str(config)
    assert FILE_SECRET not in repr(logs)


def test_a_file_with_only_connection_keys_warns_of_nothing(tmp_path: Path) -> None:
    config = tmp_path / "client.properties"
    config.write_text("bootstrap.servers=b:9092\n")

    with capture_logs() as logs:
        assert _run(["--kafka-config", str(config)]) == KafkaConnection("b:9092")

    assert logs == []


def test_a_password_file_flag_beats_the_password_env_var(tmp_path: Path) -> None:
    password = tmp_path / "password"
    password.write_text(FILE_SECRET)

    kafka = _run(
        ["--kafka-config", str(_config(tmp_path, "p")), "--sasl-password-file", str(password)],
        TOKENMILL_SASL_PASSWORD=SECRET,
    )

    assert kafka.sasl_password == FILE_SECRET
