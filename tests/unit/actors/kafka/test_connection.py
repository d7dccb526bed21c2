"""`actors.kafka.connection`: the one Kafka connection setting every client is built from.
Validated on creation, secrets kept out of `repr`, `describe()` and errors. No broker."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import pytest

from actors.kafka.connection import KafkaConnection, connection_of
from actors.kafka.errors import KafkaSettingError
from actors.kafka.oauth_token import CommandToken, FileToken
from tests.pem import Pem, self_signed

SECRET = "hunter2-Zq9!unlikely-secret"
KEY_SECRET = "keypass-Xv7-unlikely"


@pytest.fixture(scope="module")
def pem(tmp_path_factory: pytest.TempPathFactory) -> Pem:
    return self_signed(tmp_path_factory.mktemp("pem"))


def _scram(pem: Pem, **overrides: Any) -> KafkaConnection:
    settings: dict[str, Any] = {
        "bootstrap_servers": "b1:9093,b2:9093",
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_username": "svc",
        "sasl_password": SECRET,
        "ssl_ca_file": str(pem.ca),
    }
    return KafkaConnection(**{**settings, **overrides})


# --- validation -------------------------------------------------------------------------


def test_defaults_are_a_plaintext_local_broker() -> None:
    kafka = KafkaConnection()

    assert kafka.bootstrap_servers == "127.0.0.1:9092"
    assert kafka.security_protocol == "PLAINTEXT"
    assert not kafka.uses_sasl and not kafka.uses_tls


def test_protocol_and_mechanism_are_case_insensitive() -> None:
    kafka = KafkaConnection(
        security_protocol="sasl_plaintext", sasl_mechanism="plain", sasl_username="u",
        sasl_password=SECRET,
    )  # fmt: skip

    assert kafka.security_protocol == "SASL_PLAINTEXT"
    assert kafka.sasl_mechanism == "PLAIN"


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"bootstrap_servers": "  "}, "bootstrap_servers"),
        ({"security_protocol": "TLS"}, "security_protocol"),
        ({"security_protocol": "SASL_SSL"}, "sasl_mechanism"),
        ({"security_protocol": "SASL_SSL", "sasl_mechanism": "GSSAPI"}, "sasl_mechanism"),
        (
            {"security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN", "sasl_password": SECRET},
            "sasl_username",
        ),
        (
            {"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-256",
             "sasl_username": "svc"},
            "password",
        ),
        ({"security_protocol": "SASL_SSL", "sasl_mechanism": "OAUTHBEARER"}, "oauth_token_file"),
        (
            {"security_protocol": "SASL_SSL", "sasl_mechanism": "OAUTHBEARER",
             "oauth_token_file": "/nonexistent/token", "oauth_token_command": "get-token"},
            "exactly one",
        ),
        ({"sasl_mechanism": "PLAIN", "sasl_username": "svc"}, "security_protocol"),
        ({"compression_type": "brotli"}, "compression_type"),
        ({"compression_type": "GZIP"}, "compression_type"),
    ],
)  # fmt: skip
def test_a_setting_that_cannot_work_is_named(settings: dict[str, Any], named: str) -> None:
    with pytest.raises(KafkaSettingError, match=named) as raised:
        KafkaConnection(**settings)

    assert SECRET not in str(raised.value)


def test_oauth_token_file_must_exist(tmp_path: Path) -> None:
    with pytest.raises(KafkaSettingError, match="oauth_token_file"):
        KafkaConnection(
            security_protocol="SASL_SSL", sasl_mechanism="OAUTHBEARER",
            oauth_token_file=str(tmp_path / "missing"),
        )  # fmt: skip


def test_cert_without_key_is_refused(pem: Pem) -> None:
    with pytest.raises(KafkaSettingError, match="ssl_cert_file and ssl_key_file"):
        KafkaConnection(security_protocol="SSL", ssl_cert_file=str(pem.ca))
    with pytest.raises(KafkaSettingError, match="ssl_cert_file and ssl_key_file"):
        KafkaConnection(security_protocol="SSL", ssl_key_file=str(pem.key))


def test_tls_files_with_plaintext_are_refused(pem: Pem) -> None:
    with pytest.raises(KafkaSettingError, match="ssl_ca_file given but security_protocol"):
        KafkaConnection(ssl_ca_file=str(pem.ca))
    with pytest.raises(KafkaSettingError, match="ssl_ca_file"):
        KafkaConnection(
            security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN", sasl_username="u",
            sasl_password=SECRET, ssl_ca_file=str(pem.ca),
        )  # fmt: skip


@pytest.mark.parametrize("name", ["ssl_ca_file", "ssl_cert_file", "ssl_key_file"])
def test_a_missing_tls_file_is_named(pem: Pem, tmp_path: Path, name: str) -> None:
    files: dict[str, Any] = {
        "ssl_ca_file": str(pem.ca),
        "ssl_cert_file": str(pem.ca),
        "ssl_key_file": str(pem.key),
    }
    missing = tmp_path / "typo.pem"
    files[name] = str(missing)

    with pytest.raises(KafkaSettingError, match=name) as raised:
        KafkaConnection(security_protocol="SSL", **files)

    assert str(missing) in str(raised.value)


def test_a_directory_is_not_a_file(pem: Pem, tmp_path: Path) -> None:
    with pytest.raises(KafkaSettingError, match="ssl_ca_file"):
        KafkaConnection(security_protocol="SSL", ssl_ca_file=str(tmp_path))


# --- client kwargs ------------------------------------------------------------------------


def test_plaintext_client_kwargs() -> None:
    kafka = KafkaConnection("b1:9092,b2:9092")

    assert kafka.client_kwargs() == {
        "bootstrap_servers": "b1:9092,b2:9092",
        "security_protocol": "PLAINTEXT",
    }
    assert kafka.ssl_context() is None


def test_sasl_ssl_scram_client_kwargs(pem: Pem) -> None:
    kwargs = _scram(pem).client_kwargs()

    context = kwargs.pop("ssl_context")
    assert kwargs == {
        "bootstrap_servers": "b1:9093,b2:9093",
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "svc",
        "sasl_plain_password": SECRET,
    }
    assert isinstance(context, ssl.SSLContext)
    assert context.check_hostname is True
    assert context.verify_mode == ssl.CERT_REQUIRED


def test_hostname_check_can_be_turned_off(pem: Pem) -> None:
    context = _scram(pem, ssl_check_hostname=False).client_kwargs()["ssl_context"]

    assert context.check_hostname is False
    assert context.verify_mode == ssl.CERT_REQUIRED  # the certificate is still verified


def test_ssl_without_ca_file_uses_the_system_trust_store() -> None:
    context = KafkaConnection(security_protocol="SSL").ssl_context()

    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode == ssl.CERT_REQUIRED


def test_mtls_loads_the_client_certificate(pem: Pem) -> None:
    kafka = KafkaConnection(
        security_protocol="SSL", ssl_ca_file=str(pem.ca), ssl_cert_file=str(pem.ca),
        ssl_key_file=str(pem.key),
    )  # fmt: skip

    assert isinstance(kafka.ssl_context(), ssl.SSLContext)
    assert kafka.describe()["mtls"] is True


def test_oauthbearer_file_client_kwargs(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("eyJ.a.b\n")
    kafka = KafkaConnection(
        security_protocol="SASL_PLAINTEXT", sasl_mechanism="OAUTHBEARER",
        oauth_token_file=str(token),
    )  # fmt: skip

    kwargs = kafka.client_kwargs()

    assert kwargs["sasl_mechanism"] == "OAUTHBEARER"
    assert isinstance(kwargs["sasl_oauth_token_provider"], FileToken)
    assert kwargs["sasl_oauth_token_provider"].path == token
    assert "sasl_plain_password" not in kwargs


def test_oauthbearer_command_client_kwargs() -> None:
    kafka = KafkaConnection(
        security_protocol="SASL_PLAINTEXT", sasl_mechanism="OAUTHBEARER",
        oauth_token_command="get-token --audience kafka",
    )  # fmt: skip

    provider = kafka.client_kwargs()["sasl_oauth_token_provider"]

    assert isinstance(provider, CommandToken)
    assert provider.argv == ["get-token", "--audience", "kafka"]


@pytest.mark.parametrize(
    ("compression", "expected"),
    [("none", None), ("gzip", "gzip"), ("lz4", "lz4"), ("zstd", "zstd")],
)
def test_producer_kwargs_add_compression(compression: str, expected: str | None) -> None:
    kafka = KafkaConnection(compression_type=compression)

    kwargs = kafka.producer_kwargs()

    assert kwargs["compression_type"] == expected
    assert kwargs["bootstrap_servers"] == kafka.bootstrap_servers


# --- no secret shows ----------------------------------------------------------------------


def test_secrets_are_not_in_repr_or_describe(pem: Pem) -> None:
    kafka = _scram(
        pem, security_protocol="SASL_SSL", ssl_cert_file=str(pem.ca), ssl_key_file=str(pem.key),
        ssl_key_password=KEY_SECRET,
    )  # fmt: skip

    for shown in (repr(kafka), str(kafka), repr(kafka.describe())):
        assert SECRET not in shown
        assert KEY_SECRET not in shown
    assert kafka.describe() == {
        "bootstrap_servers": "b1:9093,b2:9093",
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_username": "svc",
        "ssl_ca_file": str(pem.ca),
        "mtls": True,
        "ssl_check_hostname": True,
    }


def test_describe_names_the_system_trust_store_and_compression() -> None:
    facts = KafkaConnection(security_protocol="SSL", compression_type="zstd").describe()

    assert facts["ssl_ca_file"] == "system trust store"
    assert facts["mtls"] is False
    assert facts["compression_type"] == "zstd"


def test_plaintext_describe_says_only_where() -> None:
    assert KafkaConnection("b:9092").describe() == {
        "bootstrap_servers": "b:9092",
        "security_protocol": "PLAINTEXT",
    }


@pytest.mark.parametrize(
    "settings",
    [
        {"security_protocol": "SASL_SSL", "sasl_password": SECRET},
        {"security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN", "sasl_password": SECRET},
        {"security_protocol": "SASL_SSL", "sasl_mechanism": "OAUTHBEARER",
         "sasl_password": SECRET},
        {"sasl_mechanism": "PLAIN", "sasl_username": "u", "sasl_password": SECRET},
        {"security_protocol": "BOGUS", "sasl_password": SECRET, "ssl_key_password": KEY_SECRET},
        {"compression_type": "x", "sasl_password": SECRET, "ssl_key_password": KEY_SECRET},
        {"ssl_ca_file": "/no/such", "ssl_key_password": KEY_SECRET},
    ],
)  # fmt: skip
def test_errors_never_quote_a_secret(settings: dict[str, Any]) -> None:
    with pytest.raises(KafkaSettingError) as raised:
        KafkaConnection(**settings)

    assert SECRET not in str(raised.value)
    assert KEY_SECRET not in str(raised.value)


# --- who, connection_of -------------------------------------------------------------------


def test_who_names_the_user_and_mechanism(pem: Pem) -> None:
    assert _scram(pem).who() == "user 'svc' (SCRAM-SHA-512)"


def test_who_of_oauthbearer_names_no_user() -> None:
    kafka = KafkaConnection(
        security_protocol="SASL_SSL", sasl_mechanism="OAUTHBEARER", oauth_token_command="t"
    )

    assert kafka.who() == "an OAUTHBEARER token"


def test_connection_of_an_address_is_plaintext() -> None:
    kafka = connection_of("broker:9092")

    assert kafka == KafkaConnection("broker:9092")
    assert kafka.security_protocol == "PLAINTEXT"


def test_connection_of_a_connection_is_itself(pem: Pem) -> None:
    kafka = _scram(pem)

    assert connection_of(kafka) is kafka
