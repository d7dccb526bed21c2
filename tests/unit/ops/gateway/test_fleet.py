"""What `GET /v1/models` lists: each live worker's current model, from its events."""

from __future__ import annotations

from messages.events import ModelSwapped, StatusReply, WorkerStarted, WorkerStopped
from messages.result import ModelRef
from ops.gateway.fleet import Fleet, ServedModel


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
