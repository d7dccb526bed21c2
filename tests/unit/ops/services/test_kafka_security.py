"""`ops.services.kafka_security`: the broker settings, client properties, password and TLS
material of the local broker's secured listeners. Nothing here starts a broker."""

from __future__ import annotations

import socket
import ssl
import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ops.cli import cli
from ops.errors import KafkaStartError
from ops.services.kafka import LocalKafka, render_server_properties
from ops.services.kafka_security import (
    KINDS,
    BrokerSecurity,
    SecurityRecord,
    masked,
    read_properties,
)
from ops.services.local_process import free_port

SCRAM = "org.apache.kafka.common.security.scram.ScramLoginModule required;"


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_ssl_listener_reads_the_pkcs12_keystore(tmp_path: Path) -> None:
    security = BrokerSecurity(tmp_path)

    settings = security.broker_settings(["ssl"])

    store = tmp_path / "tls" / "broker.p12"
    password = (tmp_path / "tls" / "broker.p12.pass").read_text().strip()
    assert settings == {
        "listener.name.ssl.ssl.keystore.type": "PKCS12",
        "listener.name.ssl.ssl.keystore.location": str(store),
        "listener.name.ssl.ssl.keystore.password": password,
        "listener.name.ssl.ssl.key.password": password,
    }
    assert store.is_file()


def test_mtls_listener_requires_a_client_certificate_from_the_ca(tmp_path: Path) -> None:
    settings = BrokerSecurity(tmp_path).broker_settings(["mtls"])

    assert settings["listener.name.mtls.ssl.client.auth"] == "required"
    assert settings["listener.name.mtls.ssl.truststore.type"] == "PEM"
    assert settings["listener.name.mtls.ssl.truststore.location"] == str(tmp_path / "tls/ca.pem")
    assert settings["listener.name.mtls.ssl.keystore.type"] == "PKCS12"


@pytest.mark.parametrize("kind", ["sasl_ssl", "sasl_plaintext"])
def test_sasl_listeners_take_scram_plain_and_oauthbearer(tmp_path: Path, kind: str) -> None:
    security = BrokerSecurity(tmp_path)

    settings = security.broker_settings([kind])

    prefix = f"listener.name.{kind}."
    assert settings[prefix + "sasl.enabled.mechanisms"] == (
        "SCRAM-SHA-512,SCRAM-SHA-256,PLAIN,OAUTHBEARER"
    )
    assert settings[prefix + "scram-sha-512.sasl.jaas.config"] == SCRAM
    assert settings[prefix + "scram-sha-256.sasl.jaas.config"] == SCRAM
    assert settings[prefix + "plain.sasl.jaas.config"] == (
        "org.apache.kafka.common.security.plain.PlainLoginModule required "
        f'user_tokenmill="{security.password()}";'
    )
    assert settings[prefix + "oauthbearer.sasl.jaas.config"] == (
        "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required "
        'unsecuredLoginStringClaim_sub="tokenmill";'
    )
    assert (prefix + "ssl.keystore.location" in settings) is (kind == "sasl_ssl")
    assert all(key.startswith(prefix) for key in settings)


def test_sasl_plaintext_alone_makes_no_tls_material(tmp_path: Path) -> None:
    BrokerSecurity(tmp_path).broker_settings(["sasl_plaintext"])

    assert not (tmp_path / "tls").exists()


def test_server_properties_serve_each_listener_beside_plaintext() -> None:
    ports = {"ssl": 101, "mtls": 102, "sasl_ssl": 103, "sasl_plaintext": 104}
    listeners = BrokerSecurity(Path("/s")).listeners(ports)

    text = render_server_properties(
        port=9, controller_port=10, log_dir=Path("/d"), listeners=listeners
    )

    props = dict(line.split("=", 1) for line in text.splitlines())
    assert props["listeners"] == (
        "PLAINTEXT://127.0.0.1:9,SSL://127.0.0.1:101,MTLS://127.0.0.1:102,"
        "SASL_SSL://127.0.0.1:103,SASL_PLAINTEXT://127.0.0.1:104,CONTROLLER://127.0.0.1:10"
    )
    assert props["advertised.listeners"] == props["listeners"].rsplit(",", 1)[0]
    assert props["listener.security.protocol.map"] == (
        "PLAINTEXT:PLAINTEXT,SSL:SSL,MTLS:SSL,SASL_SSL:SASL_SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,"
        "CONTROLLER:PLAINTEXT"
    )
    assert props["inter.broker.listener.name"] == "PLAINTEXT"


def test_scram_users_are_added_at_format_once_per_mechanism(tmp_path: Path) -> None:
    security = BrokerSecurity(tmp_path)
    user = f"[name=tokenmill,password={security.password()}]"

    assert security.scram_arguments() == [
        "--add-scram",
        f"SCRAM-SHA-512={user}",
        "--add-scram",
        f"SCRAM-SHA-256={user}",
    ]


def test_the_password_is_made_once_and_private(tmp_path: Path) -> None:
    first = BrokerSecurity(tmp_path).password()

    assert BrokerSecurity(tmp_path).password() == first
    assert len(first) >= 32
    assert _mode(tmp_path / "sasl.password") == 0o600
    assert BrokerSecurity(tmp_path / "other").password() != first


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("ssl", {"security.protocol": "SSL", "ssl.ca.location": "tls/ca.pem"}),
        (
            "mtls",
            {
                "security.protocol": "SSL",
                "ssl.ca.location": "tls/ca.pem",
                "ssl.certificate.location": "tls/client.pem",
                "ssl.key.location": "tls/client.key",
            },
        ),
        (
            "sasl_ssl",
            {
                "security.protocol": "SASL_SSL",
                "sasl.mechanism": "SCRAM-SHA-512",
                "sasl.username": "tokenmill",
                "sasl.password": "<password>",
                "ssl.ca.location": "tls/ca.pem",
            },
        ),
        (
            "sasl_plaintext",
            {
                "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism": "PLAIN",
                "sasl.username": "tokenmill",
                "sasl.password": "<password>",
            },
        ),
    ],
)
def test_client_properties_per_kind(tmp_path: Path, kind: str, expected: dict[str, str]) -> None:
    security = BrokerSecurity(tmp_path)

    path = security.write_client_properties(kind, "127.0.0.1:4242")

    assert path == tmp_path / f"client-{kind}.properties"
    assert _mode(path) == 0o600
    paths = {key: str(tmp_path / value) for key, value in expected.items() if "/" in value}
    password = {"sasl.password": security.password()} if "sasl.password" in expected else {}
    assert read_properties(path) == {
        "bootstrap.servers": "127.0.0.1:4242",
        **expected,
        **paths,
        **password,
    }
    assert "jaas" not in path.read_text()  # librdkafka refuses sasl.jaas.config


def test_masked_hides_the_password_only() -> None:
    shown = masked({"sasl.username": "tokenmill", "sasl.password": "s3cret"})

    assert shown == {"sasl.username": "tokenmill", "sasl.password": "***"}


def test_tls_material_is_made_once_and_reused(tmp_path: Path) -> None:
    security = BrokerSecurity(tmp_path)
    security.ensure_tls()
    made = {path.name: path.read_bytes() for path in (tmp_path / "tls").iterdir()}

    BrokerSecurity(tmp_path).ensure_tls()

    assert {path.name: path.read_bytes() for path in (tmp_path / "tls").iterdir()} == made
    assert {"ca.pem", "ca.key", "broker.p12", "client.pem", "client.key"} <= set(made)
    assert b"ENCRYPTED" not in made["client.key"]
    for name in ("ca.key", "broker.key", "broker.p12", "broker.p12.pass", "client.key"):
        assert _mode(tmp_path / "tls" / name) == 0o600, name


def test_the_ca_verifies_the_broker_for_127_0_0_1_and_the_client(tmp_path: Path) -> None:
    security = BrokerSecurity(tmp_path)
    tls = security.tls_dir
    broker = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    broker.load_cert_chain(security.tls_file("broker.pem"), tls / "broker.key")
    broker.load_verify_locations(tls / "ca.pem")
    broker.verify_mode = ssl.CERT_REQUIRED
    client = ssl.create_default_context(cafile=security.tls_file("ca.pem"))
    client.load_cert_chain(security.tls_file("client.pem"), security.tls_file("client.key"))

    server_end, client_end = socket.socketpair()
    server_end.settimeout(10)
    client_end.settimeout(10)
    with ThreadPoolExecutor(max_workers=1) as pool:
        accepted = pool.submit(_peer_of, broker, server_end)
        with client.wrap_socket(client_end, server_hostname="127.0.0.1") as tls_client:
            broker_cert = tls_client.getpeercert()
            tls_client.sendall(b"x")  # lets the server finish its side of the handshake
        client_cert = accepted.result(timeout=10)

    assert broker_cert is not None
    assert client_cert is not None
    assert broker_cert["subjectAltName"] == (("IP Address", "127.0.0.1"), ("DNS", "localhost"))
    assert (("commonName", "tokenmill"),) in client_cert["subject"]


def _peer_of(context: ssl.SSLContext, sock: socket.socket) -> Any:  # the client's certificate
    with context.wrap_socket(sock, server_side=True) as tls_server:
        tls_server.recv(1)
        return tls_server.getpeercert()


def test_the_record_reads_back_and_tolerates_garbage(tmp_path: Path) -> None:
    security = BrokerSecurity(tmp_path)
    assert security.recorded() == SecurityRecord()

    security.record(SecurityRecord(listeners={"sasl_ssl": 4242}, scram=True))
    assert security.recorded() == SecurityRecord(listeners={"sasl_ssl": 4242}, scram=True)

    (tmp_path / "security.json").write_text("[1, 2")
    assert security.recorded() == SecurityRecord()


def test_a_state_dir_formatted_without_scram_users_refuses_sasl(tmp_path: Path) -> None:
    """A state dir formatted before SCRAM users were added at format time: a clear error,
    before anything is launched."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "meta.properties").write_text("version=1\n")
    kafka = LocalKafka(state_dir=tmp_path, port=free_port(), security=("sasl_ssl",))

    with pytest.raises(KafkaStartError, match=r"without the SCRAM users.*another --state-dir"):
        kafka.start(timeout=5)
    assert kafka.pid is None
    assert not (tmp_path / "broker.json").exists()


def test_local_kafka_refuses_unknown_kinds_and_unserved_listeners(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown listener kinds"):
        LocalKafka(state_dir=tmp_path, security=("tls",))
    kafka = LocalKafka(state_dir=tmp_path, security=("ssl", "ssl"))
    assert kafka.security == ("ssl",)
    with pytest.raises(ValueError, match="serves no ssl listener"):
        kafka.listener("ssl")


def test_up_help_explains_security() -> None:
    shown = CliRunner().invoke(cli, ["up", "--help"])

    assert shown.exit_code == 0, shown.output
    assert "--security [ssl|mtls|sasl_ssl|sasl_plaintext]" in shown.output
    text = " ".join(shown.output.split())  # as wrapped for any terminal width
    assert "KIND.properties" in text
    assert "password masked" in text
    assert all(f"  {kind}  " in shown.output for kind in KINDS)
