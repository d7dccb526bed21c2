"""`actors.kafka.preflight`: which connection errors no retry can mend, named in one line.
`unusable_cause` is a pure function over exceptions; `preflight` runs against a closed local
port only (the real-broker cases are integration tests)."""

from __future__ import annotations

import asyncio
import socket
import ssl

from aiokafka import errors as kafka_errors

from actors.kafka.connection import KafkaConnection
from actors.kafka.errors import TokenUnavailable
from actors.kafka.preflight import preflight, unusable_cause

SECRET = "hunter2-Zq9!unlikely-secret"
WHERE = "h:9093"
SCRAM = KafkaConnection(
    "h:9093", security_protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-512",
    sasl_username="x", sasl_password=SECRET,
)  # fmt: skip
PLAINTEXT = KafkaConnection("h:9093")
TLS = KafkaConnection("h:9093", security_protocol="SSL")


def _chained(inner: BaseException, outer: BaseException) -> BaseException:
    """`outer`, raised from `inner` as aiokafka's clients do."""
    try:
        try:
            raise inner
        except BaseException as exc:
            raise outer from exc
    except BaseException as raised:
        return raised


def test_authentication_failure_names_the_user_and_mechanism() -> None:
    exc = kafka_errors.SaslAuthenticationFailed("Authentication failed during authentication")

    cause = unusable_cause(exc, SCRAM, WHERE)

    assert cause == "authentication failed for user 'x' (SCRAM-SHA-512) at h:9093"
    assert SECRET not in cause


def test_authentication_failure_is_found_down_the_chain() -> None:
    exc = _chained(
        kafka_errors.AuthenticationFailedError(), kafka_errors.KafkaConnectionError("bootstrap")
    )

    assert unusable_cause(exc, SCRAM, WHERE) == (
        "authentication failed for user 'x' (SCRAM-SHA-512) at h:9093"
    )


def test_untrusted_certificate_names_the_verify_message() -> None:
    exc = ssl.SSLCertVerificationError(1, "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify")
    exc.verify_message = "self-signed certificate"

    cause = unusable_cause(exc, TLS, WHERE)

    assert cause is not None
    assert cause.startswith("certificate verify failed: self-signed certificate")
    assert WHERE in cause


def test_connection_closed_on_the_first_request_is_another_protocol() -> None:
    exc = _chained(
        kafka_errors.KafkaConnectionError("Connection at h:9093 closed"),
        kafka_errors.KafkaConnectionError("Unable to bootstrap from [('h', 9093)]"),
    )

    cause = unusable_cause(exc, PLAINTEXT, WHERE)

    assert cause is not None
    assert "closed the connection" in cause
    assert "TLS or SASL listener" in cause
    assert "PLAINTEXT" in cause


def test_a_tls_client_hung_up_on_asks_for_a_plaintext_listener() -> None:
    cause = unusable_cause(ConnectionResetError(104, "Connection reset by peer"), TLS, WHERE)

    assert cause is not None
    assert "plaintext listener" in cause


def test_connection_refused_may_mend() -> None:
    assert unusable_cause(ConnectionRefusedError(111, "Connection refused"), SCRAM, WHERE) is None


def test_a_timeout_may_mend() -> None:
    assert unusable_cause(TimeoutError(), SCRAM, WHERE) is None


def test_token_unavailable_is_its_own_cause() -> None:
    exc = TokenUnavailable("OAUTHBEARER token file /t: No such file or directory")

    assert unusable_cause(exc, SCRAM, WHERE) == str(exc)


def test_illegal_sasl_state_asks_for_a_sasl_listener() -> None:
    cause = unusable_cause(kafka_errors.IllegalSaslStateError(), SCRAM, WHERE)

    assert cause is not None
    assert "SASL listener" in cause


async def test_preflight_to_a_closed_port_is_unreachable_but_usable() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    reach = await asyncio.wait_for(preflight(KafkaConnection(f"127.0.0.1:{port}"), 5.0), 10.0)

    assert reach.reachable is False
    assert reach.usable is True
    assert f"127.0.0.1:{port}" in reach.reason


async def test_preflight_refuses_an_address_without_a_port() -> None:
    reach = await preflight(KafkaConnection("broker"))

    assert reach.reachable is False
    assert reach.usable is False
    assert "'broker'" in reach.reason
