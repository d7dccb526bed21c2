"""The DLQ topic at start, on a real broker: `topic_check` tells a writable topic from a missing
one (without creating it) and from one this principal may not write; a worker whose DLQ topic
is missing refuses to start, saying so, instead of stalling its commits on the first dead
letter."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)
from structlog.testing import capture_logs

from actors.ingest.model_front import ModelFront
from actors.kafka.connection import KafkaConnection
from actors.kafka.preflight import topic_check
from actors.worker import Worker
from gpu.engine import Engine
from gpu.engine_config import EngineConfig
from gpu.loading.loader import load_model
from ops.services.kafka import LocalKafka
from ops.services.topics import create_topics
from tests.integration.conftest import local_broker
from tests.integration.pipeline import new_lane

pytestmark = pytest.mark.slow

AUTHORIZER = {
    "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
    "allow.everyone.if.no.acl.found": "true",
}


async def _topics(bootstrap: str) -> set[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return set(await admin.list_topics())
    finally:
        await admin.close()


async def test_a_dlq_is_writable_and_a_missing_one_is_said_missing_not_made(
    kafka_bootstrap: str,
) -> None:
    lane = await new_lane(kafka_bootstrap, partitions=1)
    kafka = KafkaConnection(kafka_bootstrap)
    there = await topic_check(kafka, lane.dlq)
    assert (there.answered, there.writable) == (True, True), there.reason
    missing = f"{lane.group}.no-such.dlq"
    check = await topic_check(kafka, missing)
    assert (check.answered, check.writable) == (True, False)
    assert "does not exist" in check.reason and missing in check.reason
    assert missing not in await _topics(kafka_bootstrap), "asking must not create it"


async def test_nothing_is_known_when_no_broker_answers() -> None:
    from ops.services.local_process import free_port

    check = await topic_check(KafkaConnection(f"127.0.0.1:{free_port()}"), "x.dlq", 2.0)
    assert (check.answered, check.writable) == (False, False) and check.reason


async def test_a_worker_without_its_dlq_topic_refuses_to_start(
    kafka_bootstrap: str, tiny_checkpoints: dict[str, Path]
) -> None:
    lane = await new_lane(kafka_bootstrap, partitions=1)
    config = lane.worker_config(dlq_topic=f"{lane.group}.missing.dlq")
    engine = Engine(load_model(tiny_checkpoints["llama"], name="tiny"), EngineConfig())
    worker = Worker(config, engine, ModelFront.of_engine(engine))
    with capture_logs() as logs:
        await asyncio.wait_for(worker.run(), 120)
    assert worker.exit_code == 1
    (unusable,) = [e for e in logs if e["event"] == "dlq_unusable"]
    assert "does not exist" in unusable["reason"]
    (giving_up,) = [e for e in logs if e["event"] == "worker_giving_up"]
    assert "dead-letter topic" in giving_up["reason"]


@pytest.fixture(scope="module")
def acl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    with local_broker(tmp_path_factory.mktemp("dlq-acl-kafka"), AUTHORIZER) as broker:
        yield broker


def _deny(bootstrap: str, topic: str, denied: AclOperation) -> None:
    """Anonymous may describe `topic` but not do `denied` on it."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    rules = [
        AclBinding(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, "User:ANONYMOUS", "*",
                   operation, permission)
        for operation, permission in (
            (AclOperation.DESCRIBE, AclPermissionType.ALLOW),
            (denied, AclPermissionType.DENY),
        )
    ]  # fmt: skip
    for future in admin.create_acls(rules).values():
        future.result(timeout=30)


async def test_a_dlq_the_worker_may_not_write_is_said_so(acl_broker: LocalKafka) -> None:
    kafka = KafkaConnection(acl_broker.bootstrap)
    writable, denied, hidden = "acl.ok.dlq", "acl.denied.dlq", "acl.hidden.dlq"
    for name in (writable, denied, hidden):
        await create_topics(acl_broker.bootstrap, names={"dlq": name})
    await asyncio.to_thread(_deny, acl_broker.bootstrap, denied, AclOperation.WRITE)
    admin = AdminClient({"bootstrap.servers": acl_broker.bootstrap})
    hide = AclBinding(ResourceType.TOPIC, hidden, ResourcePatternType.LITERAL, "User:ANONYMOUS",
                      "*", AclOperation.DESCRIBE, AclPermissionType.DENY)  # fmt: skip
    for future in admin.create_acls([hide]).values():
        await asyncio.to_thread(future.result, 30)
    ok = await topic_check(kafka, writable)
    assert (ok.answered, ok.writable) == (True, True), ok.reason
    no_write = await topic_check(kafka, denied)
    assert (no_write.answered, no_write.writable) == (True, False)
    assert "may not write" in no_write.reason and denied in no_write.reason
    no_describe = await topic_check(kafka, hidden)
    assert (no_describe.answered, no_describe.writable) == (True, False)
    assert "may not describe" in no_describe.reason
