"""One Kafka connection setting, shared by every client tokenmill makes.

    kafka = KafkaConnection("broker:9093", security_protocol="SASL_SSL",
                            sasl_mechanism="SCRAM-SHA-512", sasl_username="svc",
                            sasl_password="...", ssl_ca_file="ca.pem")
    AIOKafkaConsumer(**kafka.client_kwargs(), group_id="g")

The worker's consumer, producer and control clients, and every CLI command, are built from
one of these (`ops/connection` fills it from flags, `TOKENMILL_*` env vars, TOML or a client
properties file). Secrets are held out of `repr` and out of `describe()`, which is what logs,
events and errors may show.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from actors.kafka.errors import KafkaSettingError
from actors.kafka.oauth_token import CommandToken, FileToken

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
COMPRESSION_TYPES = ("none", "gzip", "snappy", "lz4", "zstd")
DEFAULT_BOOTSTRAP = "127.0.0.1:9092"


@dataclass(frozen=True)
class KafkaConnection:
    """Where the brokers are and how to reach them. Validated on creation; files are checked
    to exist, so a typo fails at start and not at the first connection."""

    bootstrap_servers: str = DEFAULT_BOOTSTRAP
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: str | None = field(default=None, repr=False)
    oauth_token_file: str | None = None  # re-read whenever it changes
    # Run again when its token nears expiry; out of repr (it may carry a client secret).
    oauth_token_command: str | None = field(default=None, repr=False)
    ssl_ca_file: str | None = None  # None: the system's trust store
    ssl_cert_file: str | None = None  # client certificate (mTLS), PEM
    ssl_key_file: str | None = None  # its private key, PEM
    ssl_key_password: str | None = field(default=None, repr=False)
    ssl_check_hostname: bool = True
    compression_type: str = "none"  # of everything tokenmill's producers send

    def __post_init__(self) -> None:
        protocol = self.security_protocol.upper()
        object.__setattr__(self, "security_protocol", protocol)
        if self.sasl_mechanism is not None:
            object.__setattr__(self, "sasl_mechanism", self.sasl_mechanism.upper())
        if not self.bootstrap_servers.strip():
            raise KafkaSettingError("bootstrap_servers must name at least one broker")
        if protocol not in SECURITY_PROTOCOLS:
            raise KafkaSettingError(
                f"security_protocol {self.security_protocol!r} is not one of "
                f"{', '.join(SECURITY_PROTOCOLS)}"
            )
        self._check_sasl()
        self._check_tls()
        if self.compression_type not in COMPRESSION_TYPES:
            raise KafkaSettingError(
                f"compression_type {self.compression_type!r} is not one of "
                f"{', '.join(COMPRESSION_TYPES)}"
            )

    @property
    def uses_sasl(self) -> bool:
        return self.security_protocol.startswith("SASL_")

    @property
    def uses_tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    def _check_sasl(self) -> None:
        mechanism = self.sasl_mechanism
        if not self.uses_sasl:
            if mechanism or self.sasl_username or self.oauth_token_file or self.oauth_token_command:
                raise KafkaSettingError(
                    f"SASL settings are given but security_protocol is {self.security_protocol}; "
                    "use SASL_SSL (or SASL_PLAINTEXT)"
                )
            return
        if mechanism is None:
            raise KafkaSettingError(
                f"security_protocol {self.security_protocol} needs sasl_mechanism "
                f"({', '.join(SASL_MECHANISMS)})"
            )
        if mechanism not in SASL_MECHANISMS:
            raise KafkaSettingError(
                f"sasl_mechanism {mechanism!r} is not one of {', '.join(SASL_MECHANISMS)}"
            )
        if mechanism == "OAUTHBEARER":
            if bool(self.oauth_token_file) == bool(self.oauth_token_command):
                raise KafkaSettingError(
                    "sasl_mechanism OAUTHBEARER needs exactly one of oauth_token_file and "
                    "oauth_token_command"
                )
            if self.oauth_token_file:
                _must_exist(self.oauth_token_file, "oauth_token_file")
        elif not self.sasl_username or self.sasl_password is None:
            raise KafkaSettingError(
                f"sasl_mechanism {mechanism} needs sasl_username and a password "
                "(--sasl-password-file, TOKENMILL_SASL_PASSWORD or sasl.password)"
            )

    def _check_tls(self) -> None:
        tls = {"ssl_ca_file": self.ssl_ca_file, "ssl_cert_file": self.ssl_cert_file,
               "ssl_key_file": self.ssl_key_file}  # fmt: skip
        given = {name: path for name, path in tls.items() if path}
        if given and not self.uses_tls:
            raise KafkaSettingError(
                f"{', '.join(given)} given but security_protocol is {self.security_protocol}; "
                "use SSL or SASL_SSL"
            )
        if bool(self.ssl_cert_file) != bool(self.ssl_key_file):
            raise KafkaSettingError("ssl_cert_file and ssl_key_file go together (mTLS)")
        for name, path in given.items():
            _must_exist(path, name)

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context of this connection; None without TLS. Verifies the broker's
        certificate (and, unless turned off, its hostname) against the CA file or the system
        trust store."""
        if not self.uses_tls:
            return None
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.ssl_ca_file)
        context.check_hostname = self.ssl_check_hostname
        if self.ssl_cert_file and self.ssl_key_file:
            context.load_cert_chain(
                self.ssl_cert_file, self.ssl_key_file, password=self.ssl_key_password
            )
        return context

    def client_kwargs(self) -> dict[str, Any]:
        """The keyword arguments every aiokafka client (consumer, producer, admin) takes."""
        kwargs: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap_servers,
            "security_protocol": self.security_protocol,
        }
        if self.uses_tls:
            kwargs["ssl_context"] = self.ssl_context()
        if self.uses_sasl:
            kwargs["sasl_mechanism"] = self.sasl_mechanism
            if self.sasl_mechanism == "OAUTHBEARER":
                kwargs["sasl_oauth_token_provider"] = (
                    FileToken(Path(self.oauth_token_file))
                    if self.oauth_token_file
                    else CommandToken(str(self.oauth_token_command))
                )
            else:
                kwargs["sasl_plain_username"] = self.sasl_username
                kwargs["sasl_plain_password"] = self.sasl_password
        return kwargs

    def producer_kwargs(self) -> dict[str, Any]:
        """`client_kwargs()` and what a producer adds: the compression of its batches."""
        compression = None if self.compression_type == "none" else self.compression_type
        return {**self.client_kwargs(), "compression_type": compression}

    def describe(self) -> dict[str, object]:
        """What logs, events and errors may say of this connection: no secret."""
        facts: dict[str, object] = {
            "bootstrap_servers": self.bootstrap_servers,
            "security_protocol": self.security_protocol,
        }
        if self.uses_sasl:
            facts["sasl_mechanism"] = self.sasl_mechanism
            if self.sasl_username:
                facts["sasl_username"] = self.sasl_username
        if self.uses_tls:
            facts["ssl_ca_file"] = self.ssl_ca_file or "system trust store"
            facts["mtls"] = bool(self.ssl_cert_file)
            facts["ssl_check_hostname"] = self.ssl_check_hostname
        if self.compression_type != "none":
            facts["compression_type"] = self.compression_type
        return facts

    def who(self) -> str:
        """The identity an authentication error names: `user 'x' (SCRAM-SHA-512)`."""
        if self.sasl_mechanism == "OAUTHBEARER":
            return "an OAUTHBEARER token"
        return f"user {self.sasl_username!r} ({self.sasl_mechanism})"


def connection_of(kafka: KafkaConnection | str) -> KafkaConnection:
    """`kafka` itself, or a plaintext connection to the bootstrap address it names."""
    return kafka if isinstance(kafka, KafkaConnection) else KafkaConnection(kafka)


def _must_exist(path: str, name: str) -> None:
    if not Path(path).is_file():
        raise KafkaSettingError(f"{name} {path} does not exist or is not a file")
