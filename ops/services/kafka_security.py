"""The local broker's secured listeners: its TLS material, the `tokenmill` user, and the client
properties files that reach each listener.

    security = BrokerSecurity(state_dir)
    security.broker_settings(("sasl_ssl",))   # merged into server.properties
    security.listeners({"sasl_ssl": 40123})   # {"SASL_SSL": ("SASL_SSL", 40123)}
    security.scram_arguments()                # for `StorageTool format`: the SCRAM users
    security.write_client_properties("sasl_ssl", "127.0.0.1:40123")  # client-sasl_ssl.properties

Listener kinds, each on a port of its own on 127.0.0.1 beside the broker's PLAINTEXT listener:

    ssl             TLS, no client certificate
    mtls            TLS, a client certificate signed by the local CA required
    sasl_ssl        SASL over TLS: SCRAM-SHA-512, SCRAM-SHA-256, PLAIN, OAUTHBEARER
    sasl_plaintext  the same SASL mechanisms without TLS

Files in the state dir, made once by `openssl` and reused (those holding a secret are 0600):

    tls/ca.pem, tls/ca.key                 the local CA, valid 10 years
    tls/broker.pem, tls/broker.key         the broker's certificate (SAN IP:127.0.0.1,
    tls/broker.p12, tls/broker.p12.pass    DNS:localhost), and as the PKCS12 keystore it reads
    tls/client.pem, tls/client.key         a client certificate for mtls (key: unencrypted PEM)
    sasl.password                          the password of user `tokenmill`, SCRAM and PLAIN
    client-<kind>.properties               librdkafka client settings for one listener kind
    security.json                          the last launch's listener ports; whether the data
                                           dir was formatted with the SCRAM users

OAUTHBEARER is Kafka's unsecured-JWT validator: any unsigned token (`{"alg":"none"}`, claims
`sub`, `iat`, `exp`) is accepted, whoever `sub` names. That suits a test broker on 127.0.0.1 and
nothing else.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ops.errors import KafkaStartError

KINDS = ("ssl", "mtls", "sasl_ssl", "sasl_plaintext")
TLS_KINDS = frozenset({"ssl", "mtls", "sasl_ssl"})
SASL_KINDS = frozenset({"sasl_ssl", "sasl_plaintext"})
PROTOCOLS = {
    "ssl": "SSL",
    "mtls": "SSL",
    "sasl_ssl": "SASL_SSL",
    "sasl_plaintext": "SASL_PLAINTEXT",
}
USER = "tokenmill"
SCRAM_MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256")
SASL_MECHANISMS = (*SCRAM_MECHANISMS, "PLAIN", "OAUTHBEARER")
CLIENT_MECHANISMS = {"sasl_ssl": "SCRAM-SHA-512", "sasl_plaintext": "PLAIN"}
SECRET_KEYS = frozenset({"sasl.password"})  # what a shown properties file masks
VALID_DAYS = 3650

_SCRAM_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"
_PLAIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
_OAUTH_MODULE = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"
# Only the signing requests read [req]; the extensions come from the sections `-extensions` names.
_OPENSSL_CNF = """[req]
distinguished_name = dn
prompt = no
[dn]
CN = tokenmill
[ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
[broker]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth, clientAuth
subjectAltName = IP:127.0.0.1, DNS:localhost
authorityKeyIdentifier = keyid
[client]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = clientAuth
authorityKeyIdentifier = keyid
"""
_TLS_COMPLETE = ("ca.pem", "broker.p12", "client.pem", "client.key")


@dataclass(frozen=True)
class SecurityRecord:
    """`security.json` read back: the listener ports of the last launch, by kind, and whether
    the data dir was formatted with the SCRAM users."""

    listeners: dict[str, int] = field(default_factory=dict)
    scram: bool = False


@dataclass(frozen=True)
class BrokerSecurity:
    """The secured-listener files of the broker whose state dir is `state_dir`."""

    state_dir: Path

    @property
    def tls_dir(self) -> Path:
        return self.state_dir / "tls"

    def tls_file(self, name: str) -> Path:
        """A file of the TLS material (`ca.pem`, `client.pem`, `client.key`, ...), made first."""
        self.ensure_tls()
        return self.tls_dir / name

    def ensure_tls(self) -> None:
        """Make the CA and the broker's and client's certificates unless they exist. They are
        made in a temporary folder renamed into place, so a half-made set is never used."""
        if all((self.tls_dir / name).is_file() for name in _TLS_COMPLETE):
            return
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=self.state_dir, prefix=".tls-") as tmp:
            staged = Path(tmp) / "tls"
            staged.mkdir(mode=0o700)
            _generate_tls(staged)
            if self.tls_dir.exists():  # incomplete: left by an interrupted run
                shutil.rmtree(self.tls_dir)
            os.rename(staged, self.tls_dir)

    def password(self) -> str:
        """The `tokenmill` user's password, made on first use."""
        path = self.state_dir / "sasl.password"
        if not path.is_file():
            self.state_dir.mkdir(parents=True, exist_ok=True)
            # URL-safe: it goes unescaped into a JAAS string and `--add-scram [..]`.
            write_private(path, secrets.token_urlsafe(24) + "\n")
        return path.read_text().strip()

    def scram_arguments(self) -> list[str]:
        """`StorageTool format` options that create the `tokenmill` SCRAM user, per mechanism.

        They hold the password, so the format command's argv does too for the second it runs.
        """
        user = f"[name={USER},password={self.password()}]"
        return [arg for mech in SCRAM_MECHANISMS for arg in ("--add-scram", f"{mech}={user}")]

    def listeners(self, ports: Mapping[str, int]) -> dict[str, tuple[str, int]]:
        """Listener name → (security protocol, port), for `render_server_properties`."""
        return {kind.upper(): (PROTOCOLS[kind], port) for kind, port in ports.items()}

    def broker_settings(self, kinds: Iterable[str]) -> dict[str, str]:
        """The server.properties settings of the listeners `kinds`, all prefixed by listener
        name; makes the TLS material and the password when a kind needs them."""
        settings: dict[str, str] = {}
        for kind in kinds:
            prefix = f"listener.name.{kind}."
            if kind in TLS_KINDS:
                self.ensure_tls()
                store_password = (self.tls_dir / "broker.p12.pass").read_text().strip()
                settings |= {
                    prefix + "ssl.keystore.type": "PKCS12",
                    prefix + "ssl.keystore.location": str(self.tls_dir / "broker.p12"),
                    prefix + "ssl.keystore.password": store_password,
                    prefix + "ssl.key.password": store_password,
                }
            if kind == "mtls":
                settings |= {
                    prefix + "ssl.client.auth": "required",
                    prefix + "ssl.truststore.type": "PEM",
                    prefix + "ssl.truststore.location": str(self.tls_dir / "ca.pem"),
                }
            if kind in SASL_KINDS:
                # The SCRAM users live in the cluster metadata; the modules only need to exist.
                settings[prefix + "sasl.enabled.mechanisms"] = ",".join(SASL_MECHANISMS)
                for mech in SCRAM_MECHANISMS:
                    settings[f"{prefix}{mech.lower()}.sasl.jaas.config"] = (
                        f"{_SCRAM_MODULE} required;"
                    )
                settings[prefix + "plain.sasl.jaas.config"] = (
                    f'{_PLAIN_MODULE} required user_{USER}="{self.password()}";'
                )
                # The broker logs itself in too; with no validator class set, it checks tokens
                # with the unsecured-JWT validator.
                settings[prefix + "oauthbearer.sasl.jaas.config"] = (
                    f'{_OAUTH_MODULE} required unsecuredLoginStringClaim_sub="{USER}";'
                )
        return settings

    def client_settings(self, kind: str, bootstrap: str) -> dict[str, str]:
        """librdkafka settings that reach the listener `kind` at `bootstrap` as `tokenmill`."""
        settings = {"bootstrap.servers": bootstrap, "security.protocol": PROTOCOLS[kind]}
        if kind in SASL_KINDS:
            settings |= {
                "sasl.mechanism": CLIENT_MECHANISMS[kind],
                "sasl.username": USER,
                "sasl.password": self.password(),
            }
        if kind in TLS_KINDS:
            settings["ssl.ca.location"] = str(self.tls_file("ca.pem"))
        if kind == "mtls":
            settings |= {
                "ssl.certificate.location": str(self.tls_file("client.pem")),
                "ssl.key.location": str(self.tls_file("client.key")),
            }
        return settings

    def client_properties_path(self, kind: str) -> Path:
        return self.state_dir / f"client-{kind}.properties"

    def write_client_properties(self, kind: str, bootstrap: str) -> Path:
        path = self.client_properties_path(kind)
        write_private(path, render_properties(self.client_settings(kind, bootstrap)))
        return path

    def recorded(self) -> SecurityRecord:
        """`security.json`, or an empty record when it is absent or unreadable."""
        try:
            fields = json.loads((self.state_dir / "security.json").read_text())
            return SecurityRecord(
                listeners={k: int(v) for k, v in fields["listeners"].items() if k in KINDS},
                scram=fields["scram"] is True,
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return SecurityRecord()

    def record(self, record: SecurityRecord) -> None:
        fields = {"listeners": record.listeners, "scram": record.scram}
        (self.state_dir / "security.json").write_text(json.dumps(fields) + "\n")


def render_properties(settings: Mapping[str, str]) -> str:
    return "".join(f"{key}={value}\n" for key, value in settings.items())


def read_properties(path: Path) -> dict[str, str]:
    """A `key=value` properties file as a dict (librdkafka's form: no escapes, `#` comments)."""
    settings = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            settings[key.strip()] = value.strip()
    return settings


def masked(settings: Mapping[str, str]) -> dict[str, str]:
    """`settings` with each secret shown as `***`."""
    return {key: "***" if key in SECRET_KEYS else value for key, value in settings.items()}


def write_private(path: Path, text: str) -> None:
    """Write `text` to `path`, readable by its owner only (also when it existed before)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)


def _generate_tls(out: Path) -> None:
    write_private(out / "broker.p12.pass", secrets.token_urlsafe(24) + "\n")
    (out / "openssl.cnf").write_text(_OPENSSL_CNF)
    days = str(VALID_DAYS)
    rsa = ("-config", "openssl.cnf", "-newkey", "rsa:2048", "-nodes")
    _openssl(out, "req", "-x509", *rsa, "-extensions", "ca", "-days", days,
             "-subj", "/CN=tokenmill local CA", "-keyout", "ca.key", "-out", "ca.pem")  # fmt: skip
    for name, subject in (("broker", "/CN=localhost"), ("client", f"/CN={USER}")):
        _openssl(out, "req", "-new", *rsa, "-subj", subject,
                 "-keyout", f"{name}.key", "-out", f"{name}.csr")  # fmt: skip
        _openssl(out, "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                 "-set_serial", f"0x{secrets.randbits(63):x}", "-days", days,
                 "-extfile", "openssl.cnf", "-extensions", name, "-out", f"{name}.pem")  # fmt: skip
        (out / f"{name}.csr").unlink()
    _openssl(out, "pkcs12", "-export", "-in", "broker.pem", "-inkey", "broker.key",
             "-certfile", "ca.pem", "-name", "broker", "-out", "broker.p12",
             "-passout", "file:broker.p12.pass")  # fmt: skip
    (out / "openssl.cnf").unlink()
    for name in ("ca.key", "broker.key", "client.key", "broker.p12"):
        (out / name).chmod(0o600)


def _openssl(cwd: Path, *args: str) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        raise KafkaStartError(
            "`openssl` is not on PATH; it makes the local broker's TLS certificates "
            "(install it, e.g. `apt-get install openssl`)"
        )
    done = subprocess.run(
        [openssl, *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )
    if done.returncode != 0:
        raise KafkaStartError(
            f"`openssl {args[0]}` failed (exit {done.returncode}) making the broker's TLS "
            f"material:\n{(done.stdout + done.stderr).strip()[-2000:]}"
        )
