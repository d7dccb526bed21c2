"""Can this connection work at all? One connection to a bootstrap broker tells the errors no
retry can mend (bad credentials, an untrusted certificate, a plaintext client on a TLS port)
from a broker that is only away.

    reach = await preflight(kafka)
    reach.usable     False: `reach.reason` is one line naming the cause, for the operator
    reach.reachable  False: the broker is away (wait for it, or give up after a timeout)

aiokafka's clients log such causes and then fail with only "Unable to bootstrap", so a client
that cannot start asks this for the reason (see `actors.broker_wait`), and every command runs it
before anything else.

    check = await topic_check(kafka, "tokenmill.dlq")
    check.answered   False: no broker answered (nothing is known)
    check.writable   False: `check.reason` says why (missing, or this principal may not write)

A topic a worker must be able to write (the DLQ: a dead letter it cannot write holds its
partition's commits back) is checked at start with one metadata request for that topic alone,
never creating it. What that can tell: whether the topic exists, whether this principal may
describe it (else the broker says TOPIC_AUTHORIZATION_FAILED), and, from a broker that
reports authorized operations (Metadata v8+, Kafka 2.3+; an authorizer, if any, is asked),
whether it may WRITE it. What it cannot: a produce-time refusal that is not an ACL (a policy,
a record too large); those meet the emitter's own handling.
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass
from typing import Any

from aiokafka import errors as kafka_errors
from aiokafka.conn import create_conn
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.metadata import MetadataRequest, MetadataRequest_v5
from aiokafka.protocol.types import Array, Boolean, Int16, Int32, Schema, String

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
    conn = None
    try:
        conn = await _connect(connection, host, port, timeout_s)
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


# -- can this principal write a topic? ---------------------------------------------------------


@dataclass(frozen=True)
class TopicCheck:
    answered: bool  # a broker answered the question (else nothing is known)
    writable: bool  # as far as the broker says (see the module's doc)
    reason: str = ""  # why not, or why nothing is known: one line


_UNKNOWN_TOPIC = 3  # UNKNOWN_TOPIC_OR_PARTITION
_TOPIC_AUTHORIZATION_FAILED = 29
_WRITE = 1 << 4  # AclOperation.WRITE, as a bit of `topic_authorized_operations`
_OPERATIONS_UNKNOWN = -(2**31)  # the broker did not say (not asked, or not known)


async def topic_check(
    connection: KafkaConnection, topic: str, timeout_s: float = PREFLIGHT_TIMEOUT_S
) -> TopicCheck:
    """Whether `topic` exists and this connection's principal may write it (see the module's
    doc for how far that goes), from the first bootstrap broker that answers. Never creates
    the topic; never raises for what the broker or network does."""
    last = TopicCheck(answered=False, writable=False, reason="no bootstrap address")
    for address in connection.bootstrap_servers.split(","):
        host, _, port = address.strip().rpartition(":")
        if not host or not port.isdigit():
            return TopicCheck(
                False, False, f"bootstrap address {address.strip()!r} is not host:port"
            )
        last = await _ask_topic(connection, host.strip("[]"), int(port), topic, timeout_s)
        if last.answered:
            return last
    return last


async def _ask_topic(
    connection: KafkaConnection, host: str, port: int, topic: str, timeout_s: float
) -> TopicCheck:
    where = f"{host}:{port}"
    conn = None
    try:
        conn = await _connect(connection, host, port, timeout_s)
        response = await asyncio.wait_for(conn.send(_TopicMetadata([topic])), timeout_s)
    except Exception as exc:
        return TopicCheck(False, False, f"{where}: {_short(exc)}")
    finally:
        if conn is not None:
            conn.close()
    who = connection.who() if connection.uses_sasl else "this worker's principal"
    return topic_verdict(topic, response.topics, who)


def topic_verdict(topic: str, topics: list[tuple[object, ...]], who: str) -> TopicCheck:
    """What a metadata response's `topics` (v5 or v8 rows) say about writing `topic`."""
    for row in topics:
        error, name = row[0], row[1]
        if name != topic:
            continue
        if error == _UNKNOWN_TOPIC:
            return TopicCheck(True, False, f"topic {topic!r} does not exist")
        if error == _TOPIC_AUTHORIZATION_FAILED:
            return TopicCheck(True, False, f"{who} may not describe (so not write) topic {topic!r}")
        operations = row[4] if len(row) > 4 else _OPERATIONS_UNKNOWN
        if operations != _OPERATIONS_UNKNOWN and not int(operations) & _WRITE:  # type: ignore[call-overload]
            return TopicCheck(True, False, f"{who} may not write topic {topic!r}")
        return TopicCheck(True, True)
    return TopicCheck(True, False, f"the broker did not answer for topic {topic!r}")


class _MetadataResponse_v8(Response):  # type: ignore[misc]
    API_KEY = 3
    API_VERSION = 8
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        ("brokers", Array(("node_id", Int32), ("host", String("utf-8")), ("port", Int32),
                          ("rack", String("utf-8")))),
        ("cluster_id", String("utf-8")),
        ("controller_id", Int32),
        ("topics", Array(
            ("error_code", Int16),
            ("topic", String("utf-8")),
            ("is_internal", Boolean),
            ("partitions", Array(
                ("error_code", Int16),
                ("partition", Int32),
                ("leader", Int32),
                ("leader_epoch", Int32),
                ("replicas", Array(Int32)),
                ("isr", Array(Int32)),
                ("offline_replicas", Array(Int32)),
            )),
            ("topic_authorized_operations", Int32),
        )),
        ("cluster_authorized_operations", Int32),
    )  # fmt: skip


class _MetadataRequest_v8(RequestStruct):  # type: ignore[misc]
    """aiokafka stops at v5; v8 adds the authorized operations (v6, v7 add nothing asked)."""

    API_KEY = 3
    API_VERSION = 8
    RESPONSE_TYPE = _MetadataResponse_v8
    SCHEMA = Schema(
        ("topics", Array(String("utf-8"))),
        ("allow_auto_topic_creation", Boolean),
        ("include_cluster_authorized_operations", Boolean),
        ("include_topic_authorized_operations", Boolean),
    )


class _TopicMetadata(Request[MetadataRequest_v5 | _MetadataRequest_v8]):  # type: ignore[misc]
    """Metadata for these topics only, never auto-creating them: v8 where the broker has it."""

    API_KEY = 3

    def __init__(self, topics: list[str]) -> None:
        self._topics = topics

    def build(self, request_struct_class: type[RequestStruct]) -> RequestStruct:
        if request_struct_class.API_VERSION >= 8:
            return request_struct_class(self._topics, False, False, True)
        return request_struct_class(self._topics, False)


async def _connect(connection: KafkaConnection, host: str, port: int, timeout_s: float) -> Any:
    """One connection to `host:port` with the connection's security settings."""
    kwargs = connection.client_kwargs()
    kwargs.pop("bootstrap_servers")
    return await asyncio.wait_for(
        create_conn(host, port, request_timeout_ms=int(timeout_s * 1000), **kwargs), timeout_s
    )
