"""Can this connection work at all? One connection to a bootstrap broker tells the errors no
retry can mend (bad credentials, an untrusted certificate, a plaintext client on a TLS port)
from a broker that is only away.

    reach = await preflight(kafka)
    reach.usable     False: `reach.reason` is one line naming the cause, for the operator
    reach.reachable  False: the broker is away (wait for it, or give up after a timeout)

aiokafka's clients log such causes and then fail with only "Unable to bootstrap", so a client
that cannot start asks this for the reason (see `actors.broker_wait`), and every command runs it
before anything else.
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass

from aiokafka import errors as kafka_errors
from aiokafka.conn import create_conn
from aiokafka.protocol.metadata import MetadataRequest

from actors.kafka.connection import KafkaConnection
from actors.kafka.errors import TokenUnavailable

PREFLIGHT_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Reach:
    reachable: bool
    usable: bool
    reason: str = ""


async def preflight(connection: KafkaConnection, timeout_s: float = PREFLIGHT_TIMEOUT_S) -> Reach:
    """Connect to each bootstrap address in turn (TCP, TLS, SASL, one ApiVersions request)
    until one answers. Never raises for what the broker or network does."""
    last = Reach(reachable=False, usable=True, reason="no bootstrap address")
    for address in connection.bootstrap_servers.split(","):
        host, _, port = address.strip().rpartition(":")
        if not host or not port.isdigit():
            return Reach(False, False, f"bootstrap address {address.strip()!r} is not host:port")
        last = await _try(connection, host.strip("[]"), int(port), timeout_s)
        if last.reachable or not last.usable:
            return last
    return last


async def _try(connection: KafkaConnection, host: str, port: int, timeout_s: float) -> Reach:
    where = f"{host}:{port}"
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
    except (OSError, TimeoutError) as exc:
        return Reach(False, True, f"cannot reach {where}: {_short(exc)}")
    writer.close()
    kwargs = connection.client_kwargs()
    kwargs.pop("bootstrap_servers")
    conn = None
    try:
        conn = await asyncio.wait_for(
            create_conn(host, port, request_timeout_ms=int(timeout_s * 1000), **kwargs),
            timeout_s,
        )
        # A SASL listener answers ApiVersions before authentication: ask for metadata too.
        await asyncio.wait_for(conn.send(MetadataRequest([])), timeout_s)
    except Exception as exc:
        cause = unusable_cause(exc, connection, where)
        if cause is not None:
            return Reach(True, False, cause)
        return Reach(False, True, f"{where}: {_short(exc)}")
    finally:
        if conn is not None:
            conn.close()
    return Reach(True, True)


def unusable_cause(exc: BaseException, connection: KafkaConnection, where: str) -> str | None:
    """One line naming why `exc` will recur on every retry, or None when it may not."""
    chain = list(_chain(exc))
    for err in chain:
        if isinstance(
            err, kafka_errors.SaslAuthenticationFailed | kafka_errors.AuthenticationFailedError
        ):
            return f"authentication failed for {connection.who()} at {where}"
        if isinstance(err, kafka_errors.UnsupportedSaslMechanismError):
            return f"{where}: {err.args[0] if err.args else 'SASL mechanism not enabled'}"
        if isinstance(err, kafka_errors.IllegalSaslStateError):
            return (
                f"{where} refused SASL: is it a SASL listener? (security_protocol "
                f"{connection.security_protocol})"
            )
        if isinstance(err, TokenUnavailable):
            return str(err)
        if isinstance(err, ssl.SSLCertVerificationError):
            return f"certificate verify failed: {err.verify_message} ({where})"
        if isinstance(err, ssl.SSLError):
            return _tls_cause(err, connection, where)
    if any(_closed_early(err) for err in chain):
        # It listens, then hangs up on what it was sent: it speaks another protocol.
        return (
            f"{where} closed the connection on the first request: is it a "
            f"{'plaintext' if connection.uses_tls else 'TLS or SASL'} listener? "
            f"(security_protocol {connection.security_protocol})"
        )
    return None


def _tls_cause(err: ssl.SSLError, connection: KafkaConnection, where: str) -> str:
    reason = (err.reason or str(err)).lower()
    if "certificate_required" in reason or "certificate required" in reason:
        return f"{where} requires a client certificate (mTLS): give ssl_cert_file and ssl_key_file"
    if "wrong_version" in reason or "record_layer" in reason or "unknown_protocol" in reason:
        return f"TLS handshake with {where} failed ({err.reason}): is it a TLS listener?"
    if "bad_certificate" in reason and not connection.ssl_cert_file:
        return f"{where} requires a client certificate (mTLS): give ssl_cert_file and ssl_key_file"
    if "unknown_ca" in reason or "bad_certificate" in reason:
        return f"{where} refused the client certificate ({err.reason}): is it signed by its CA?"
    return f"TLS with {where} failed: {err.reason or err}"


def _closed_early(err: BaseException) -> bool:
    text = str(err)
    return (
        isinstance(err, kafka_errors.KafkaConnectionError)
        and ("closed" in text or "reset" in text.lower())
    ) or isinstance(err, ConnectionResetError | asyncio.IncompleteReadError)


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def _short(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__
