"""What `GET /v1/models` lists: each live worker's current model, from its events, less the
workers gone from the consumer group."""

from __future__ import annotations

import asyncio
import io

import msgspec
import pytest
from aiokafka.errors import GroupAuthorizationFailedError
from aiokafka.protocol.admin import DescribeGroupsResponse_v1, DescribeGroupsResponse_v3
from structlog.testing import capture_logs

from actors.kafka.connection import KafkaConnection
from messages.events import (
    ModelSwapped,
    StatusReply,
    WorkerDraining,
    WorkerStarted,
    WorkerStopped,
)
from messages.result import ModelRef
from ops.gateway.fleet import Fleet, FleetWatch, ServedModel, group_workers


def ref(name: str) -> ModelRef:
    return ModelRef(name=name, digest=f"sha256:{name}")


def started(worker: str, name: str, at: float) -> WorkerStarted:
    return WorkerStarted(worker=worker, at=at, model=ref(name), group="g", requests_topic="r")


def test_started_workers_list_their_models_once_each() -> None:
    fleet = Fleet()
    fleet.apply(started("w1", "smollm2", 100.0))
    fleet.apply(started("w2", "smollm2", 200.0))
    fleet.apply(started("w3", "gemma3", 300.0))
    assert fleet.models() == [ServedModel("gemma3", 300), ServedModel("smollm2", 100)]


def test_a_swap_moves_a_worker_and_a_stop_takes_it_off() -> None:
    fleet = Fleet()
    fleet.apply(started("w1", "smollm2", 100.0))
    fleet.apply(
        ModelSwapped(
            worker="w1", at=150.0, from_model=ref("smollm2"), to_model=ref("gemma3"),
            load_ms=1.0, smoke_ms=1.0, flip_ms=1.0,
        )
    )  # fmt: skip
    assert [m.name for m in fleet.models()] == ["gemma3"]
    fleet.apply(WorkerStopped(worker="w1", at=160.0, answered=3, failed_on_shutdown=0))
    assert fleet.models() == []


def test_a_status_reply_names_a_worker_started_before_the_topic_s_retention() -> None:
    fleet = Fleet()
    reply = StatusReply(
        worker="w9", at=5.0, model=ref("smollm2"), uptime_s=1.0, queued=0, running=0,
        kv_blocks_used=0, kv_blocks_total=8,
    )  # fmt: skip
    fleet.apply(reply)
    assert [m.name for m in fleet.models()] == ["smollm2"]


def test_a_worker_gone_from_the_group_and_silent_a_refresh_long_is_hidden() -> None:
    fleet = Fleet()
    fleet.apply(started("w1", "smollm2", 100.0))
    fleet.apply(started("w2", "gemma3", 100.0))
    fleet.list_only({"w1"}, now=131.0, grace_s=30.0)
    assert fleet.models() == [ServedModel("smollm2", 100)]
    assert fleet.hidden == {"w2"}


def test_a_worker_heard_from_within_a_refresh_stays_listed_before_it_joins() -> None:
    fleet = Fleet()
    fleet.apply(started("w1", "smollm2", 100.0))
    fleet.list_only(set(), now=130.0, grace_s=30.0)
    assert [m.name for m in fleet.models()] == ["smollm2"]


def test_any_later_event_counts_as_heard_from() -> None:
    fleet = Fleet()
    fleet.apply(started("w1", "smollm2", 100.0))
    fleet.apply(WorkerDraining(worker="w1", at=200.0, reason="signal", in_flight=0))
    fleet.list_only(set(), now=220.0, grace_s=30.0)
    assert [m.name for m in fleet.models()] == ["smollm2"]


def test_a_hidden_worker_is_listed_again_when_it_rejoins_or_speaks() -> None:
    fleet = Fleet()
    fleet.apply(started("w1", "smollm2", 100.0))
    fleet.list_only(set(), now=200.0, grace_s=30.0)
    assert fleet.models() == []
    fleet.list_only({"w1"}, now=230.0, grace_s=30.0)
    assert [m.name for m in fleet.models()] == ["smollm2"]
    fleet.list_only(set(), now=260.0, grace_s=30.0)
    fleet.apply(status("w1", "smollm2", 261.0))
    assert [m.name for m in fleet.models()] == ["smollm2"]


def test_a_model_stays_listed_while_one_listed_worker_serves_it() -> None:
    fleet = Fleet()
    fleet.apply(started("w1", "smollm2", 100.0))
    fleet.apply(started("w2", "smollm2", 150.0))
    fleet.list_only({"w2"}, now=300.0, grace_s=30.0)
    assert fleet.models() == [ServedModel("smollm2", 100)]


def test_members_that_are_not_known_workers_list_nothing() -> None:
    fleet = Fleet()
    fleet.list_only({"w7"}, now=300.0, grace_s=30.0)
    assert fleet.models() == [] and fleet.hidden == set()


def test_a_stopped_worker_is_forgotten_even_while_hidden() -> None:
    fleet = Fleet()
    fleet.apply(started("w1", "smollm2", 100.0))
    fleet.list_only(set(), now=200.0, grace_s=30.0)
    fleet.apply(WorkerStopped(worker="w1", at=201.0, answered=0, failed_on_shutdown=0))
    assert fleet.hidden == set()
    fleet.list_only(set(), now=300.0, grace_s=30.0)
    assert fleet.models() == []


def test_group_workers_reads_client_ids_from_a_describe_groups_response() -> None:
    member = ("m-1", "tokenmill-host-42", "/10.0.0.1", b"", b"")
    other = ("m-3", "rdkafka", "/10.0.0.2", b"", b"")
    raw = DescribeGroupsResponse_v3(
        throttle_time_ms=0,
        groups=[(0, "tokenmill", "Stable", "consumer", "range", [member, other], 0)],
    ).encode()
    assert group_workers([DescribeGroupsResponse_v3.decode(io.BytesIO(raw))]) == {"host-42"}


def test_group_workers_raises_a_group_s_error() -> None:
    denied = DescribeGroupsResponse_v1(
        throttle_time_ms=0, groups=[(30, "tokenmill", "", "", "", [])]
    )
    with pytest.raises(GroupAuthorizationFailedError):
        group_workers([denied])


async def test_a_group_that_cannot_be_read_hides_no_one_and_warns_once() -> None:
    answers: list[set[str] | Exception] = [GroupAuthorizationFailedError()] * 3 + [{"w1"}]
    all_given = asyncio.Event()

    async def members(group_id: str) -> set[str]:  # a fake broker, then one that hangs
        assert group_id == "g"
        if not answers:
            all_given.set()
            await asyncio.Event().wait()
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    watch = FleetWatch(KafkaConnection("127.0.0.1:1"), "events", "g", 0.001, clock=lambda: 500.0)
    watch._members = members  # type: ignore[method-assign]
    watch.fleet.apply(started("w1", "smollm2", 100.0))
    watch.fleet.apply(started("w2", "gemma3", 100.0))
    with capture_logs() as logs:
        checking = asyncio.create_task(watch._check("g"))
        await asyncio.wait_for(all_given.wait(), 30)
        checking.cancel()
        with pytest.raises(asyncio.CancelledError):
            await checking
    assert [(e["event"], e["log_level"]) for e in logs] == [
        ("fleet_group_unread", "warning"),
        ("fleet_group_read", "info"),
        ("fleet_workers_hidden", "info"),
    ]
    assert [m.name for m in watch.fleet.models()] == ["smollm2"]


def status(worker: str, name: str, at: float) -> StatusReply:
    return StatusReply(
        worker=worker, at=at, model=ref(name), uptime_s=1.0, queued=0, running=0,
        kv_blocks_used=0, kv_blocks_total=8,
    )  # fmt: skip


def test_a_model_card_s_max_model_len_is_the_least_its_workers_announce() -> None:
    fleet = Fleet()
    fleet.apply(started("w1", "smollm2", 100.0))  # an older worker: says none
    assert fleet.models() == [ServedModel("smollm2", 100, None)]
    for worker, length in (("w2", 8192), ("w3", 2048)):
        event = started(worker, "smollm2", 110.0)
        fleet.apply(msgspec.structs.replace(event, max_model_len=length))
    assert fleet.models() == [ServedModel("smollm2", 100, 2048)]


def test_a_model_is_served_under_each_name_its_workers_take() -> None:
    fleet = Fleet()
    fleet.apply(started("w1", "/models/SmolLM2-135M.gguf", 100.0))
    names = ("/models/SmolLM2-135M.gguf", "sha256:/models/SmolLM2-135M.gguf",
             "SmolLM2-135M.gguf", "SmolLM2-135M", None)  # fmt: skip
    assert all(fleet.serves(name) for name in names)
    assert not fleet.serves("gemma3")
    found = fleet.find("SmolLM2-135M")
    assert found is not None and found.name == "/models/SmolLM2-135M.gguf"
    fleet.list_only(set(), now=1000.0, grace_s=30.0)  # gone from the group, silent
    assert not fleet.serves(None) and fleet.find("SmolLM2-135M") is None


def test_nothing_is_refused_until_the_events_are_read_to_their_end() -> None:
    watch = FleetWatch(KafkaConnection("127.0.0.1:1"), "events")
    assert not watch.refuses("smollm2"), "not read yet: unknown, so sent"
    watch.caught_up = True
    assert watch.refuses("smollm2") and watch.refuses(None)
    watch.fleet.apply(started("w1", "smollm2", 100.0))
    assert not watch.refuses("smollm2") and not watch.refuses(None)
    assert watch.refuses("gemma3")


def embedder(worker: str, name: str, at: float) -> WorkerStarted:
    model = ModelRef(name=name, digest=f"sha256:{name}", task="embed")
    return WorkerStarted(worker=worker, at=at, model=model, group="g", requests_topic="r")


def test_each_model_s_task_is_as_its_workers_announce_it() -> None:
    fleet = Fleet()
    fleet.apply(started("w1", "smollm2", 100.0))
    fleet.apply(embedder("w2", "embeddinggemma-300m", 200.0))
    assert fleet.models() == [
        ServedModel("embeddinggemma-300m", 200, task="embed"),
        ServedModel("smollm2", 100, task="generate"),
    ]
    assert fleet.tasks("smollm2") == {"generate"}
    assert fleet.tasks("sha256:embeddinggemma-300m") == {"embed"}  # named as `serves` matches
    assert fleet.tasks(None) == {"embed", "generate"}
    assert fleet.tasks("gpt-4o") == set()


def test_a_request_for_a_task_no_worker_of_its_model_does_is_told_at_once() -> None:
    watch = FleetWatch(KafkaConnection("127.0.0.1:1"), "events")
    watch.fleet.apply(embedder("w1", "embeddinggemma-300m", 100.0))
    assert watch.other_task("embeddinggemma-300m", "embed") is None
    assert watch.other_task(None, "embed") is None
    assert watch.other_task("embeddinggemma-300m", "generate") is None  # the topic is not read
    watch.caught_up = True
    assert watch.other_task("embeddinggemma-300m", "generate") == "embed"
    assert watch.other_task(None, "generate") == "embed"  # every listed worker embeds
    assert watch.other_task("gpt-4o", "generate") is None  # not served: `refuses` says so
    watch.fleet.apply(started("w2", "smollm2", 110.0))
    assert watch.other_task(None, "generate") is None  # some worker generates
    assert watch.other_task("smollm2", "embed") == "generate"
