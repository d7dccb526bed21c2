"""`ops.connection.properties`: Kafka client properties files as Confluent Cloud, MSK and Java
clients hand them out, in the librdkafka and the Java dialect."""

from __future__ import annotations

from pathlib import Path

import pytest

from actors.kafka.connection import KafkaConnection
from actors.kafka.errors import KafkaSettingError
from ops.connection.properties import parse_properties, read_properties
from tests.pem import self_signed

CONFLUENT_CLOUD = """\
# Required connection configs for Kafka producer, consumer, and admin
bootstrap.servers=pkc-abc12.us-east-1.aws.confluent.cloud:9092
security.protocol=SASL_SSL
sasl.mechanisms=PLAIN
sasl.username=ABCDEFGHIJKLMNOP
sasl.password=cflt-Secret/With+Chars==

# Best practice for higher availability in librdkafka clients prior to 1.7
session.timeout.ms=45000

client.id=ccloud-python-client-1234

# Required connection configs for Confluent Cloud Schema Registry
schema.registry.url=https://psrc-xyz.us-east-2.aws.confluent.cloud
basic.auth.credentials.source=USER_INFO
basic.auth.user.info=SRKEY:SRSECRET
"""

MSK_SCRAM = """\
bootstrap.servers=b-1.msk.kafka.us-east-1.amazonaws.com:9096,b-2.msk.kafka.us-east-1.amazonaws.com:9096
security.protocol=SASL_SSL
sasl.mechanism=SCRAM-SHA-512
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \\
    username="alice" \\
    password="msk-secret";
ssl.truststore.type=PEM
ssl.truststore.location={ca}
"""


def _write(tmp_path: Path, text: str, name: str = "client.properties") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def ca_pem(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return self_signed(tmp_path_factory.mktemp("pem")).ca


# --- the dialects -------------------------------------------------------------------------


def test_confluent_cloud_librdkafka_file(tmp_path: Path) -> None:
    read = read_properties(_write(tmp_path, CONFLUENT_CLOUD))

    assert read.settings == {
        "bootstrap_servers": "pkc-abc12.us-east-1.aws.confluent.cloud:9092",
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "PLAIN",
        "sasl_username": "ABCDEFGHIJKLMNOP",
        "sasl_password": "cflt-Secret/With+Chars==",
    }
    assert read.unused == (
        "session.timeout.ms",
        "client.id",
        "schema.registry.url",
        "basic.auth.credentials.source",
        "basic.auth.user.info",
    )
    assert "cflt-Secret" not in repr(read)


def test_confluent_cloud_file_makes_a_connection(tmp_path: Path) -> None:
    settings = read_properties(_write(tmp_path, CONFLUENT_CLOUD)).settings

    kafka = KafkaConnection(**settings)  # type: ignore[arg-type]

    assert kafka.who() == "user 'ABCDEFGHIJKLMNOP' (PLAIN)"
    assert kafka.client_kwargs()["sasl_plain_password"] == "cflt-Secret/With+Chars=="


@pytest.mark.parametrize("quote", ["'", '"'])
def test_java_plain_jaas_config(tmp_path: Path, quote: str) -> None:
    text = (
        "bootstrap.servers=pkc-abc12.confluent.cloud:9092\n"
        "security.protocol=SASL_SSL\n"
        "sasl.mechanism=PLAIN\n"
        "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required "
        f"username={quote}KEY{quote} password={quote}SECRET{quote};\n"
        "client.dns.lookup=use_all_dns_ips\n"
        "acks=all\n"
    )

    read = read_properties(_write(tmp_path, text))

    assert read.settings == {
        "bootstrap_servers": "pkc-abc12.confluent.cloud:9092",
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "PLAIN",
        "sasl_username": "KEY",
        "sasl_password": "SECRET",
    }
    assert read.unused == ("client.dns.lookup", "acks")


def test_msk_scram_with_a_pem_truststore(tmp_path: Path, ca_pem: Path) -> None:
    read = read_properties(_write(tmp_path, MSK_SCRAM.format(ca=ca_pem)))

    assert read.settings == {
        "bootstrap_servers": "b-1.msk.kafka.us-east-1.amazonaws.com:9096,"
        "b-2.msk.kafka.us-east-1.amazonaws.com:9096",
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_username": "alice",
        "sasl_password": "msk-secret",
        "ssl_ca_file": str(ca_pem),
    }
    assert read.unused == ()
    kafka = KafkaConnection(**read.settings)  # type: ignore[arg-type]
    assert kafka.who() == "user 'alice' (SCRAM-SHA-512)"
    assert kafka.client_kwargs()["ssl_context"].check_hostname is True


def test_a_pem_truststore_type_is_case_insensitive(tmp_path: Path, ca_pem: Path) -> None:
    text = f"ssl.truststore.location={ca_pem}\nssl.truststore.type=pem\n"

    assert read_properties(_write(tmp_path, text)).settings == {"ssl_ca_file": str(ca_pem)}


def test_librdkafka_tls_locations(tmp_path: Path, ca_pem: Path) -> None:
    key = ca_pem.with_name("k.pem")
    text = (
        "security.protocol=SSL\n"
        f"ssl.ca.location={ca_pem}\n"
        f"ssl.certificate.location={ca_pem}\n"
        f"ssl.key.location={key}\n"
        "ssl.key.password=kp\n"
        "compression.codec=lz4\n"
    )

    settings = read_properties(_write(tmp_path, text)).settings

    assert settings == {
        "security_protocol": "SSL",
        "ssl_ca_file": str(ca_pem),
        "ssl_cert_file": str(ca_pem),
        "ssl_key_file": str(key),
        "ssl_key_password": "kp",
        "compression_type": "lz4",
    }


@pytest.mark.parametrize(("value", "check"), [("", False), ("none", False), ("https", True)])
def test_endpoint_identification_sets_the_hostname_check(
    tmp_path: Path, ca_pem: Path, value: str, check: bool
) -> None:
    text = f"security.protocol=SSL\nssl.ca.location={ca_pem}\n"
    text += f"ssl.endpoint.identification.algorithm={value}\n"

    settings = read_properties(_write(tmp_path, text)).settings

    assert settings["ssl_check_hostname"] is check
    context = KafkaConnection(**settings).ssl_context()  # type: ignore[arg-type]
    assert context is not None and context.check_hostname is check


# --- the properties syntax ----------------------------------------------------------------


def test_comments_and_separators() -> None:
    text = (
        "# a comment\n"
        "! another comment\n"
        "   # an indented comment\n"
        "\n"
        "a=1\n"
        "b: 2\n"
        "c 3\n"
        "d = 4\n"
        "e\t:\t5\n"
        "f=x=y:z\n"
        "g\n"
        "h=\n"
    )

    assert [(key, value) for _, key, value in parse_properties(text)] == [
        ("a", "1"),
        ("b", "2"),
        ("c", "3"),
        ("d", "4"),
        ("e", "5"),
        ("f", "x=y:z"),
        ("g", ""),
        ("h", ""),
    ]


def test_line_numbers_count_comments_and_blank_lines() -> None:
    text = "# c\n\na=1\n! c\nb=2\n"

    assert [(line, key) for line, key, _ in parse_properties(text)] == [(3, "a"), (5, "b")]


def test_backslash_continues_a_line() -> None:
    text = "list=a,\\\n    b,\\\n    c\nnext=1\n"

    assert parse_properties(text) == [(1, "list", "a,b,c"), (4, "next", "1")]


def test_an_escaped_backslash_does_not_continue() -> None:
    assert parse_properties("path=C:\\\\\nnext=1\n") == [(1, "path", "C:\\"), (2, "next", "1")]


def test_a_continuation_at_the_end_of_the_text() -> None:
    assert parse_properties("a=1\\") == [(1, "a", "1")]


def test_escapes() -> None:
    text = "caf\\u00e9=\\u0041\\u00DFc\nkey\\ with\\:sep=tab\\there\\nnl\n"

    assert [(key, value) for _, key, value in parse_properties(text)] == [
        ("café", "Aßc"),
        ("key with:sep", "tab\there\nnl"),
    ]


# --- what cannot be honoured --------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "key", "hint"),
    [
        ("ssl.keystore.location=/etc/kafka/client.jks", "ssl.keystore.location", "PEM"),
        ("ssl.keystore.password=ks-secret", "ssl.keystore.password", "PEM"),
        (
            "sasl.oauthbearer.token.endpoint.url=https://idp/token",
            "sasl.oauthbearer.token.endpoint.url",
            "--oauth-token-command",
        ),
        ("sasl.kerberos.service.name=kafka", "sasl.kerberos.service.name", "SCRAM"),
        ("ssl.cipher.suites=TLS_AES_256_GCM_SHA384", "ssl.cipher.suites", "ssl.ca.location"),
    ],
)
def test_an_unhonoured_security_key_names_file_line_and_key(
    tmp_path: Path, line: str, key: str, hint: str
) -> None:
    path = _write(tmp_path, f"# header\nbootstrap.servers=b:9092\n{line}\n")

    with pytest.raises(KafkaSettingError) as raised:
        read_properties(path)

    message = str(raised.value)
    assert f"{path}:3" in message
    assert key in message
    assert hint in message
    assert "ks-secret" not in message


def test_a_jks_truststore_is_refused(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "ssl.truststore.location=/etc/kafka/truststore.jks\nssl.truststore.type=JKS\n",
    )

    with pytest.raises(KafkaSettingError) as raised:
        read_properties(path)

    message = str(raised.value)
    assert str(path) in message
    assert "ssl.truststore.type JKS" in message
    assert "keytool" in message


def test_a_truststore_without_a_type_is_jks(tmp_path: Path) -> None:
    path = _write(tmp_path, "ssl.truststore.location=/etc/kafka/truststore.jks\n")

    with pytest.raises(KafkaSettingError, match=r"ssl\.truststore\.type JKS"):
        read_properties(path)


def test_an_unknown_login_module_is_named(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "bootstrap.servers=b:9092\n"
        "sasl.jaas.config=org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule "
        'required clientSecret="idp-secret";\n',
    )

    with pytest.raises(KafkaSettingError) as raised:
        read_properties(path)

    message = str(raised.value)
    assert f"{path}:2" in message
    assert "sasl.jaas.config" in message
    assert "OAuthBearerLoginModule" in message
    assert "idp-secret" not in message


@pytest.mark.parametrize(
    "jaas",
    [
        'username="KEY" password="SECRET";',
        'org.apache.kafka.common.security.plain.PlainLoginModule username="KEY" password="SECRET";',
        "",
    ],
)
def test_a_malformed_jaas_line_is_named(tmp_path: Path, jaas: str) -> None:
    path = _write(tmp_path, f"sasl.jaas.config={jaas}\n")

    with pytest.raises(KafkaSettingError) as raised:
        read_properties(path)

    message = str(raised.value)
    assert f"{path}:1" in message
    assert "sasl.jaas.config" in message
    assert "SECRET" not in message


def test_a_jaas_line_without_a_password_is_named(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required "
        'username="KEY";\n',
    )

    with pytest.raises(KafkaSettingError, match=r":1: sasl\.jaas\.config needs username and"):
        read_properties(path)


def test_a_bad_endpoint_identification_is_named(tmp_path: Path) -> None:
    path = _write(tmp_path, "ssl.endpoint.identification.algorithm=http\n")

    with pytest.raises(KafkaSettingError, match=r":1: ssl.endpoint.identification.algorithm"):
        read_properties(path)


def test_a_bad_compression_is_named(tmp_path: Path) -> None:
    with pytest.raises(KafkaSettingError, match=r"compression\.type 'brotli'"):
        read_properties(_write(tmp_path, "compression.type=brotli\n"))


def test_an_unreadable_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(KafkaSettingError, match=r"cannot read .*missing\.properties"):
        read_properties(tmp_path / "missing.properties")


def test_settings_from_a_file_whose_files_are_missing_fail_in_the_connection(
    tmp_path: Path,
) -> None:
    text = "security.protocol=SSL\nssl.ca.location=/no/such/ca.pem\n"
    settings = read_properties(_write(tmp_path, text)).settings

    with pytest.raises(KafkaSettingError, match=r"ssl_ca_file /no/such/ca\.pem"):
        KafkaConnection(**settings)  # type: ignore[arg-type]
