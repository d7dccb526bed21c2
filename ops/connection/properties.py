"""A Kafka client properties file, as Java and librdkafka clients (and Confluent Cloud, MSK,
Aiven) hand them out, read as is.

    bootstrap.servers=pkc-123.us-east-1.aws.confluent.cloud:9092
    security.protocol=SASL_SSL
    sasl.mechanisms=PLAIN
    sasl.username=KEY
    sasl.password=SECRET

Both dialects are read: librdkafka's (`sasl.username`, `ssl.ca.location`, ...) and Java's
(`sasl.jaas.config` with the PLAIN or SCRAM login module, a PEM truststore). A security key
(`security.*`, `sasl.*`, `ssl.*`) tokenmill cannot honour is an error naming it: ignoring it
could connect with less protection than the file asks for. Any other key tokenmill does not use
(`session.timeout.ms`, `schema.registry.url`, ...) is listed in `unused`, for one warning.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from actors.kafka.connection import COMPRESSION_TYPES
from actors.kafka.errors import KafkaSettingError

# property key -> KafkaConnection field
_DIRECT = {
    "bootstrap.servers": "bootstrap_servers",
    "metadata.broker.list": "bootstrap_servers",  # librdkafka's older name
    "security.protocol": "security_protocol",
    "sasl.mechanism": "sasl_mechanism",
    "sasl.mechanisms": "sasl_mechanism",  # librdkafka's name
    "sasl.username": "sasl_username",
    "sasl.password": "sasl_password",
    "ssl.ca.location": "ssl_ca_file",
    "ssl.certificate.location": "ssl_cert_file",
    "ssl.key.location": "ssl_key_file",
    "ssl.key.password": "ssl_key_password",
    "compression.type": "compression_type",
    "compression.codec": "compression_type",  # librdkafka's alias
}
_SECURITY_PREFIXES = ("security.", "sasl.", "ssl.")
_LOGIN_MODULES = {
    "org.apache.kafka.common.security.plain.PlainLoginModule": "PLAIN",
    "org.apache.kafka.common.security.scram.ScramLoginModule": "SCRAM",
}
_JAAS = re.compile(r"^\s*(?P<module>[\w.$]+)\s+(?P<flag>required|requisite|sufficient|optional)"
                   r"(?P<options>.*?);?\s*$", re.S)  # fmt: skip
_JAAS_OPTION = re.compile(r"""(\w+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|'((?:[^'\\]|\\.)*)'|(\S+))""")


@dataclass(frozen=True)
class ClientProperties:
    """What a properties file says: `settings` are `KafkaConnection` keyword arguments,
    `unused` the keys that do not concern tokenmill's connection."""

    path: Path
    settings: dict[str, object] = field(repr=False)
    unused: tuple[str, ...] = ()


def read_properties(path: Path) -> ClientProperties:
    """Read `path`; `KafkaSettingError` names the file, the line and the key when something
    cannot be honoured."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise KafkaSettingError(f"cannot read {path}: {exc.strerror}") from exc
    settings: dict[str, object] = {}
    unused: list[str] = []
    for line_no, key, value in parse_properties(text):
        where = f"{path}:{line_no}"
        if key in _DIRECT:
            settings[_DIRECT[key]] = value
        elif key == "sasl.jaas.config":
            settings.update(_jaas(value, where))
        elif key == "ssl.endpoint.identification.algorithm":
            settings["ssl_check_hostname"] = _hostname_check(value, where)
        elif key in ("ssl.truststore.location", "ssl.truststore.type"):
            settings[key] = value  # resolved below, once both may be known
        elif key.startswith(_SECURITY_PREFIXES):
            raise KafkaSettingError(f"{where}: tokenmill cannot honour {key}; {_hint(key)}")
        else:
            unused.append(key)
    _truststore(settings, str(path))
    compression = settings.get("compression_type")
    if compression is not None and compression not in COMPRESSION_TYPES:
        raise KafkaSettingError(
            f"{path}: compression.type {compression!r} is not one of {', '.join(COMPRESSION_TYPES)}"
        )
    return ClientProperties(path, settings, tuple(unused))


def parse_properties(text: str) -> list[tuple[int, str, str]]:
    """(line number, key, value) of a Java properties text: `#`/`!` comments, `=`, `:` or
    whitespace separators, a trailing backslash continuing the line, and the usual escapes."""
    entries: list[tuple[int, str, str]] = []
    logical, start = "", 0
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.lstrip() if logical else raw.strip()
        if not logical:
            if not line or line[0] in "#!":
                continue
            start = number
        if _continues(line):
            logical += line[:-1]
            continue
        logical += line
        key, value = _split(logical)
        entries.append((start, _unescape(key), _unescape(value)))
        logical = ""
    if logical:
        key, value = _split(logical)
        entries.append((start, _unescape(key), _unescape(value)))
    return entries


def _continues(line: str) -> bool:
    trailing = len(line) - len(line.rstrip("\\"))
    return trailing % 2 == 1


def _split(line: str) -> tuple[str, str]:
    i = 0
    while i < len(line):
        c = line[i]
        if c == "\\":
            i += 2
            continue
        if c in "=: \t":
            key, rest = line[:i], line[i:].lstrip(" \t")
            if (rest[:1] in ("=", ":") and c in " \t") or c in "=:":
                rest = rest[1:].lstrip(" \t")
            return key, rest
        i += 1
    return line, ""


def _unescape(text: str) -> str:
    out, i = [], 0
    simple = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "u" and re.fullmatch(r"[0-9a-fA-F]{4}", text[i + 2 : i + 6]):
                out.append(chr(int(text[i + 2 : i + 6], 16)))
                i += 6
                continue
            out.append(simple.get(nxt, nxt))
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out)


def _jaas(value: str, where: str) -> dict[str, object]:
    """The username and password of a PLAIN or SCRAM `sasl.jaas.config`."""
    match = _JAAS.match(value)
    if match is None:
        raise KafkaSettingError(f"{where}: sasl.jaas.config is not `<LoginModule> required ...;`")
    module = match["module"]
    if module not in _LOGIN_MODULES:
        raise KafkaSettingError(
            f"{where}: tokenmill cannot honour sasl.jaas.config with {module}; it reads the "
            "PLAIN and SCRAM login modules (OAUTHBEARER: --oauth-token-file or "
            "--oauth-token-command)"
        )
    options = {
        m[1]: next(g for g in m.groups()[1:] if g is not None).replace('\\"', '"')
        for m in _JAAS_OPTION.finditer(match["options"])
    }
    if "username" not in options or "password" not in options:
        raise KafkaSettingError(f"{where}: sasl.jaas.config needs username and password")
    return {"sasl_username": options["username"], "sasl_password": options["password"]}


def _hostname_check(value: str, where: str) -> bool:
    if value.lower() in ("https",):
        return True
    if value.lower() in ("", "none"):
        return False
    raise KafkaSettingError(
        f"{where}: ssl.endpoint.identification.algorithm {value!r} is neither https nor none"
    )


def _truststore(settings: dict[str, object], where: str) -> None:
    location = settings.pop("ssl.truststore.location", None)
    kind = str(settings.pop("ssl.truststore.type", "JKS" if location else "")).upper()
    if location is None:
        return
    if kind != "PEM":
        raise KafkaSettingError(
            f"{where}: tokenmill cannot honour ssl.truststore.type {kind}; give the CA as PEM "
            "(ssl.ca.location, or ssl.truststore.type=PEM; `keytool -exportcert -rfc` "
            "converts one)"
        )
    settings.setdefault("ssl_ca_file", location)


def _hint(key: str) -> str:
    if key.startswith("sasl.kerberos") or key.startswith("sasl.oauthbearer"):
        return (
            "it supports PLAIN, SCRAM-SHA-256/512 and OAUTHBEARER with a token from a file "
            "or a command (--oauth-token-file, --oauth-token-command)"
        )
    if key.startswith("ssl.keystore"):
        return (
            "give the client certificate and key as PEM (ssl.certificate.location, "
            "ssl.key.location)"
        )
    known = sorted(k for k in _DIRECT if k.startswith(_SECURITY_PREFIXES))
    return f"the security keys it reads are {', '.join(known)}, sasl.jaas.config, " + (
        "ssl.endpoint.identification.algorithm and a PEM ssl.truststore"
    )
