"""`ops.services.kafka`, `ops.services.topics` and `tokenmill up/down/topics` against a real
broker."""

from __future__ import annotations

import os
import re
import uuid
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import KafkaError
from click.testing import CliRunner

from ops.cli import cli
from ops.services.kafka import LocalKafka
from ops.services.local_process import free_port
from ops.services.topics import DEFAULT_TOPICS, create_topics, describe_topics


async def test_produce_consume_round_trip(kafka_bootstrap: str) -> None:
    topic = f"roundtrip-{uuid.uuid4().hex[:8]}"
    await create_topics(kafka_bootstrap, names={"dlq": topic})  # one partition
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        sent = await producer.send_and_wait(topic, b"hello", key=b"k")
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=kafka_bootstrap, auto_offset_reset="earliest", group_id=None
    )
    await consumer.start()
    try:
        record = await consumer.getone()
    finally:
        await consumer.stop()
    assert (record.key, record.value, record.offset) == (b"k", b"hello", sent.offset)


async def test_the_broker_creates_no_topic_on_its_own(kafka_bootstrap: str) -> None:
    """Auto-creation is off: a request's reply_to (or a typo) never makes a topic."""
    topic = f"nowhere-{uuid.uuid4().hex[:8]}"
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, request_timeout_ms=2000)
    await producer.start()
    try:
        with pytest.raises(KafkaError):
            await producer.send_and_wait(topic, b"hello")
    finally:
        await producer.stop()
    assert topic not in await describe_topics(kafka_bootstrap)


async def test_create_topics_is_idempotent(kafka_bootstrap: str) -> None:
    names = {role: f"{name}-{uuid.uuid4().hex[:8]}" for role, name in DEFAULT_TOPICS.items()}

    first = await create_topics(kafka_bootstrap, requests_partitions=3, names=names)
    again = await create_topics(kafka_bootstrap, requests_partitions=3, names=names)

    retries = [f"{names['requests']}.retry.{n}" for n in (1, 2)]  # --max-attempts 3
    assert sorted(first) == sorted([*names.values(), *retries])
    assert again == []
    counts = await describe_topics(kafka_bootstrap)
    assert {name: counts[name] for name in [*names.values(), *retries]} == {
        names["requests"]: 3,
        names["results"]: 3,
        names["dlq"]: 1,
        names["control"]: 1,
        names["events"]: 1,
        names["cancel"]: 1,
        retries[0]: 3,
        retries[1]: 3,
    }


async def test_requests_topic_takes_a_10_mb_message(kafka_bootstrap: str) -> None:
    # The worker must see an oversized request to reject it; the broker must not refuse it.
    names = {"requests": f"big-{uuid.uuid4().hex[:8]}"}
    await create_topics(kafka_bootstrap, requests_partitions=1, names=names)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, max_request_size=16 << 20)
    await producer.start()
    try:
        sent = await producer.send_and_wait(names["requests"], b"x" * 10_000_000)
    finally:
        await producer.stop()
    assert sent.offset == 0


def test_start_twice_reuses_the_running_broker(kafka: LocalKafka) -> None:
    again = LocalKafka(state_dir=kafka.state_dir, port=kafka.port)

    assert again.start() is False
    assert again.pid == kafka.pid


def test_cli_up_and_down(tmp_path: Path) -> None:
    port, state = free_port(), tmp_path / "kafka"
    runner = CliRunner()
    up = ["up", "--kafka-port", str(port), "--state-dir", str(state)]
    down = ["down", "--state-dir", str(state)]

    started = runner.invoke(cli, up)
    try:
        assert started.exit_code == 0, started.output
        assert started.stdout == f"127.0.0.1:{port}\n"
        assert "started" in started.stderr
        pid = int(re.search(r"pid (\d+)", started.stderr)[1])  # type: ignore[index]

        reused = runner.invoke(cli, up)
        assert reused.exit_code == 0, reused.output
        assert "already running" in reused.stderr
        assert f"pid {pid}" in reused.stderr
    finally:
        stopped = runner.invoke(cli, down)
    assert stopped.exit_code == 0, stopped.output
    assert stopped.stdout == f"kafka: stopped (pid {pid})\n"
    assert not _alive(pid)

    none = runner.invoke(cli, down)
    assert none.exit_code == 0, none.output
    assert "none running" in none.stdout


def test_cli_topics_create_and_list(kafka_bootstrap: str) -> None:
    # Other tests on the session broker may have created the default topics already.
    runner = CliRunner()
    env = {"TOKENMILL_BOOTSTRAP_SERVERS": kafka_bootstrap}

    first = runner.invoke(cli, ["topics", "create", "--partitions", "2"], env=env)
    again = runner.invoke(cli, ["topics", "create"], env=env)
    listed = runner.invoke(cli, ["topics", "list"], env=env)

    assert first.exit_code == 0, first.output
    assert again.exit_code == 0, again.output
    assert listed.exit_code == 0, listed.output
    states = {line.split()[1]: line.split()[0] for line in first.stdout.splitlines()}
    retries = {f"{DEFAULT_TOPICS['requests']}.retry.{n}" for n in (1, 2)}  # --max-attempts 3
    assert set(states) == set(DEFAULT_TOPICS.values()) | retries
    assert set(states.values()) <= {"created", "exists"}
    assert [line.split()[0] for line in again.stdout.splitlines()] == ["exists"] * len(states)
    shown = dict(line.split() for line in listed.stdout.splitlines())
    if states["tokenmill.requests"] == "created":
        assert (shown["tokenmill.requests"], shown["tokenmill.results"]) == ("2", "2")
    assert shown["tokenmill.dlq"] == "1"
    assert {line.split()[1]: line.split()[2] for line in again.stdout.splitlines()} == {
        name: shown[name] for name in states
    }


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
