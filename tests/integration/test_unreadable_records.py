"""Records aiokafka cannot parse, as a non-Python client writes them (`foreign_records`),
between good requests on a real broker.

A header key that is not UTF-8 used to raise inside `getmany()`: the ingest crashed on every
fetch of it and the worker gave up; on the cancel topic, every worker of every group did. Now
such a record is answered `unreadable_record` and dead-lettered, the worker stays up with no
actor restarted, and a worker started afterwards on the same group is unaffected.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from actors.ingest.model_front import ModelFront
from actors.worker import Worker
from gpu.engine import Engine
from gpu.engine_config import EngineConfig
from gpu.loading.loader import load_model
from messages import headers as h
from messages.error_codes import ErrorCode
from ops.services.topics import create_topics
from tests.integration.foreign_records import produce_raw_batch
from tests.integration.pipeline import Lane, new_lane, read_all, results_by_id

BAD_KEY = b"\xff\xfekey-name"  # as `kcat -H $'\xff\xfekey-name=v'` writes it


def _request(request_id: str, n: int) -> bytes:
    body = {"id": request_id, "prompt_token_ids": [n + 3, 7, 9], "max_new_tokens": 2}
    return json.dumps(body).encode()


async def produce_foreign(
    bootstrap: str, topic: str, records: list[tuple[str, bytes, bool]]
) -> None:
    """(key, value, bad header key?) in order, as one batch to partition 0, so a bad record
    sits inside a batch with good ones on either side."""
    batch = []
    for key, value, bad in records:
        headers: list[tuple[str | bytes, bytes]] = [("content-type", b"application/json")]
        if bad:
            headers.append((BAD_KEY, b"v"))
        batch.append((key.encode(), value, headers))
    await produce_raw_batch(bootstrap, topic, batch)


@pytest.fixture(scope="module")
def tiny(tiny_checkpoints: dict[str, Path]) -> Any:
    return load_model(tiny_checkpoints["llama"], name="tiny")


async def _lane_with_cancels(bootstrap: str) -> tuple[Lane, str]:
    lane = await new_lane(bootstrap, partitions=2)
    cancel_topic = f"{lane.requests.removesuffix('.requests')}.cancel"
    await create_topics(bootstrap, names={"cancel": cancel_topic})
    return lane, cancel_topic


async def _run_until_answered(
    lane: Lane, cancel_topic: str, model: Any, expected: dict[str, Any]
) -> tuple[dict[str, Any], Worker]:
    engine = Engine(model, EngineConfig())
    config = lane.worker_config(cancel_topic=cancel_topic)
    worker = Worker(config, engine, ModelFront.of_engine(engine))
    task = asyncio.create_task(worker.run())
    try:
        found = await results_by_id(lane, expected)
    finally:
        worker.drain()
        await asyncio.wait_for(task, 120)
    assert worker.supervisor.exit_code == 0
    return found, worker


async def test_header_keys_not_utf8_on_requests_and_cancels(
    kafka_bootstrap: str, tiny: Any
) -> None:
    lane, cancel_topic = await _lane_with_cancels(kafka_bootstrap)
    records = [(f"good-{i}", _request(f"good-{i}", i), False) for i in range(20)]
    records.insert(7, ("bad-1", _request("bad-1", 50), True))
    records.insert(15, ("bad-2", b"not even json", True))
    await produce_foreign(lane.bootstrap, lane.requests, records)
    cancel = json.dumps({"id": "good-19"}).encode()  # unreadable: must not cancel anything
    await produce_foreign(lane.bootstrap, cancel_topic, [("c", cancel, True), ("c", b"{}", True)])

    expected: dict[str, Any] = {f"good-{i}": None for i in range(20)}
    expected |= {"bad-1": ErrorCode.UNREADABLE_RECORD, "bad-2": ErrorCode.UNREADABLE_RECORD}
    found, worker = await _run_until_answered(lane, cancel_topic, tiny, expected)

    assert worker.supervisor.policy.total() == 0, "no actor restarted"
    for request_id, code in expected.items():
        (result,) = found[request_id]
        if code is None:
            assert result.error is None and result.token_ids, (request_id, result)
        else:
            assert result.error is not None and result.error.code == code, result
            assert "not UTF-8" in result.error.message
    letters = await read_all(lane.bootstrap, lane.dlq, until=2)
    assert sorted((r.key or b"").decode() for r in letters) == ["bad-1", "bad-2"]
    for letter in letters:
        names = dict(letter.headers)
        assert names[h.DLQ_ERROR_CODE] == b"unreadable_record"
        assert names[h.DLQ_SOURCE_TOPIC].decode() == lane.requests
        assert names[h.DLQ_SOURCE_PARTITION] == b"0"
        assert letter.value in (_request("bad-1", 50), b"not even json")
        assert BAD_KEY.decode("utf-8", "surrogateescape") not in names, letter.headers

    # A second worker on the same group and partitions: nothing left to trip on.
    late = [(f"late-{i}", _request(f"late-{i}", i), False) for i in range(3)]
    await produce_foreign(lane.bootstrap, lane.requests, late)
    more, second = await _run_until_answered(
        lane, cancel_topic, tiny, {f"late-{i}": None for i in range(3)}
    )
    assert second.supervisor.policy.total() == 0
    assert all(more[f"late-{i}"][0].error is None for i in range(3))
    every = await read_all(lane.bootstrap, lane.results, until=26, within_s=5)  # none extra
    assert len(every) == 25, "each record answered exactly once"
