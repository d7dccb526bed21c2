"""A reply_to topic the worker may see but not write: the broker's refusal arrives with the
acknowledgement, and the result is answered on the results topic instead.

The broker of this module is its own, with Kafka's `StandardAuthorizer` (everything allowed
where no ACL is set) and one topic on which the anonymous principal may describe but not write.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from gpu.engine import Engine
from gpu.engine_config import EngineConfig
from gpu.loading.loader import load_model
from messages import headers as h
from messages.error_codes import ErrorCode
from messages.request import GenerateRequest
from ops.services.kafka import LocalKafka
from ops.services.topics import create_topics
from tests.integration.conftest import local_broker
from tests.integration.pipeline import (
    new_lane,
    produce,
    read_all,
    results_by_id,
    running_worker,
    wait_committed_to_end,
)

pytestmark = pytest.mark.slow

AUTHORIZER = {
    "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
    "allow.everyone.if.no.acl.found": "true",
}


@pytest.fixture(scope="module")
def acl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    with local_broker(tmp_path_factory.mktemp("acl-kafka"), AUTHORIZER) as broker:
        yield broker


def deny_writes(bootstrap: str, topic: str) -> None:
    """Anonymous may describe `topic` (so it is listed) but not write it."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    rules = [
        AclBinding(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, "User:ANONYMOUS", "*",
                   operation, permission)
        for operation, permission in (
            (AclOperation.DESCRIBE, AclPermissionType.ALLOW),
            (AclOperation.WRITE, AclPermissionType.DENY),
        )
    ]  # fmt: skip
    for future in admin.create_acls(rules).values():
        future.result(timeout=30)


async def test_a_reply_to_the_worker_may_not_write_is_answered_on_the_results_topic(
    acl_broker: LocalKafka, tiny_checkpoints
) -> None:
    lane = await new_lane(acl_broker.bootstrap, partitions=1)
    denied = f"{lane.group}-denied.results"
    await create_topics(acl_broker.bootstrap, names={"results": denied})
    await asyncio.to_thread(deny_writes, acl_broker.bootstrap, denied)
    engine = Engine(load_model(tiny_checkpoints["llama"], name="tiny"), EngineConfig())
    request = GenerateRequest(
        id="denied", prompt_token_ids=[5, 6], max_new_tokens=2, reply_to=denied
    )
    ok = GenerateRequest(id="ok", prompt_token_ids=[5, 7], max_new_tokens=2)
    async with running_worker(lane.worker_config(), engine) as worker:
        await produce(lane.bootstrap, lane.requests, [request, ok])
        found = await results_by_id(lane, ["denied", "ok"])
        await wait_committed_to_end(lane)
        assert not worker.supervisor.down
    (result,) = found["denied"]
    assert result.error is not None and result.error.code is ErrorCode.REPLY_TO_REFUSED
    assert "TopicAuthorizationFailed" in result.error.message and denied in result.error.message
    assert result.usage.completion_tokens == 2, "it ran; its answer went elsewhere"
    assert found["ok"][0].error is None
    (letter,) = await read_all(lane.bootstrap, lane.dlq, until=1)
    assert dict(letter.headers)[h.DLQ_ERROR_CODE] == b"reply_to_refused"
