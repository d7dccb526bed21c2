"""The local broker's secured listeners (`LocalKafka(security=...)`, `tokenmill up --security`)
against a real broker, through librdkafka (confluent-kafka) configured by nothing but the
client properties files the broker's state dir holds."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from ops.cli import cli
from ops.services.kafka import LocalKafka
from ops.services.kafka_security import read_properties
from ops.services.local_process import alive
from ops.services.topics import create_topics

_WAIT_S = 30.0


async def _new_topic(kafka: LocalKafka) -> str:
    topic = f"secured-{uuid.uuid4().hex[:8]}"
    await create_topics(kafka.bootstrap, names={"dlq": topic})  # one partition
    return topic


def _config(kafka: LocalKafka, kind: str) -> dict[str, Any]:
    return dict(read_properties(kafka.client_properties(kind)))


def _round_trip(config: dict[str, Any], topic: str) -> bytes:
    """Produce one record with `config`, then read it back from offset 0 with it."""
    producer = Producer(config)
    producer.produce(topic, b"hello", key=b"k")
    assert producer.flush(_WAIT_S) == 0, "not delivered in time"
    consumer = Consumer({**config, "group.id": f"reader-{topic}", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    try:
        deadline = time.monotonic() + _WAIT_S
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None:
                assert message.error() is None, message.error()
                value = message.value()
                assert value is not None
                return value
    finally:
        consumer.close()
    raise AssertionError(f"nothing read from {topic} within {_WAIT_S:.0f} s")


def _first_error(config: dict[str, Any]) -> KafkaError:
    """The first error librdkafka reports while a producer connects with `config`."""
    errors: list[KafkaError] = []
    producer = Producer({**config, "error_cb": errors.append})
    deadline = time.monotonic() + _WAIT_S
    while not errors and time.monotonic() < deadline:
        producer.poll(0.2)  # returns early when the error arrives
    assert errors, f"no error within {_WAIT_S:.0f} s"
    return errors[0]


def _unsigned_jwt(**claims: Any) -> str:
    def part(fields: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(fields).encode()).rstrip(b"=").decode()

    return f"{part({'alg': 'none'})}.{part(claims)}."


def _oauthbearer(kafka: LocalKafka, token: str) -> dict[str, Any]:
    config = _config(kafka, "sasl_ssl")
    for key in ("sasl.username", "sasl.password"):
        del config[key]
    # confluent-kafka asks oauth_cb for (token, expiry in epoch seconds).
    config |= {"sasl.mechanism": "OAUTHBEARER", "oauth_cb": lambda _: (token, time.time() + 3600)}
    return config


@pytest.mark.parametrize(
    ("kind", "mechanism"),
    [
        ("ssl", None),
        ("mtls", None),
        ("sasl_ssl", None),  # SCRAM-SHA-512, as the file says
        ("sasl_ssl", "SCRAM-SHA-256"),
        ("sasl_ssl", "PLAIN"),
        ("sasl_plaintext", None),  # PLAIN, as the file says
        ("sasl_plaintext", "SCRAM-SHA-512"),
    ],
)
async def test_each_listener_round_trips_with_its_properties_file(
    secured_kafka: LocalKafka, kind: str, mechanism: str | None
) -> None:
    topic = await _new_topic(secured_kafka)
    config = _config(secured_kafka, kind)
    assert config["bootstrap.servers"] == secured_kafka.listener(kind)
    if mechanism is not None:
        config["sasl.mechanism"] = mechanism

    assert await asyncio.to_thread(_round_trip, config, topic) == b"hello"


async def test_oauthbearer_takes_an_unsigned_jwt(secured_kafka: LocalKafka) -> None:
    topic = await _new_topic(secured_kafka)
    now = int(time.time())
    token = _unsigned_jwt(sub="tokenmill", iat=now, exp=now + 3600)

    assert await asyncio.to_thread(_round_trip, _oauthbearer(secured_kafka, token), topic) == (
        b"hello"
    )


@pytest.mark.parametrize(
    ("kind", "mechanism"),
    [("sasl_ssl", None), ("sasl_ssl", "SCRAM-SHA-256"), ("sasl_plaintext", None)],
)
async def test_a_wrong_password_fails_authentication(
    secured_kafka: LocalKafka, kind: str, mechanism: str | None
) -> None:
    config = {**_config(secured_kafka, kind), "sasl.password": "not-the-password"}
    if mechanism is not None:
        config["sasl.mechanism"] = mechanism

    error = await asyncio.to_thread(_first_error, config)

    assert error.code() == KafkaError._AUTHENTICATION, error
    assert "Authentication failed" in error.str()


async def test_a_jwt_without_exp_fails_authentication(secured_kafka: LocalKafka) -> None:
    token = _unsigned_jwt(sub="tokenmill", iat=int(time.time()))

    error = await asyncio.to_thread(_first_error, _oauthbearer(secured_kafka, token))

    assert error.code() == KafkaError._AUTHENTICATION, error


async def test_mtls_refuses_a_client_without_a_certificate(secured_kafka: LocalKafka) -> None:
    config = _config(secured_kafka, "mtls")
    del config["ssl.certificate.location"], config["ssl.key.location"]

    error = await asyncio.to_thread(_first_error, config)

    # TLS 1.3: the client hears the broker's "bad certificate" alert after its handshake.
    assert error.code() in (KafkaError._TRANSPORT, KafkaError._SSL), error
    assert "certificate" in error.str()


def test_cli_up_security_prints_the_listener_and_never_the_password(tmp_path: Path) -> None:
    state = tmp_path / "kafka"
    runner = CliRunner()
    up = ["up", "--security", "sasl_ssl", "--state-dir", str(state), "--kafka-port", "0"]
    down = ["down", "--state-dir", str(state)]

    started = runner.invoke(cli, up)
    try:
        assert started.exit_code == 0, started.output
        pid = int(re.search(r"pid (\d+)", started.stderr)[1])  # type: ignore[index]
        adopted = LocalKafka(state_dir=state, port=0)  # as another process would
        assert adopted.start() is False
        password = adopted.sasl_password()
        properties = adopted.client_properties("sasl_ssl")
        assert started.stdout == f"{adopted.listener('sasl_ssl')}\n"
        assert adopted.listener("sasl_ssl") != adopted.bootstrap
        assert password not in started.stdout + started.stderr
        assert f"{properties}:" in started.stderr
        assert "sasl.password=***" in started.stderr
        assert read_properties(properties)["sasl.password"] == password

        reused = runner.invoke(cli, up)
        assert reused.exit_code == 0, reused.output
        assert "already running" in reused.stderr
        assert reused.stdout == started.stdout

        lacking = runner.invoke(cli, [*up[:2], "ssl", *up[3:]])
        assert lacking.exit_code != 0
        assert "runs without the ssl listener" in lacking.output
    finally:
        stopped = runner.invoke(cli, down)
    assert stopped.exit_code == 0, stopped.output
    assert stopped.stdout == f"kafka: stopped (pid {pid})\n"
    assert not alive(pid)
