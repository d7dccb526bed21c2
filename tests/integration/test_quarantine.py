"""A record that kills every worker running it is quarantined, not run forever.

Real worker subprocesses with `TOKENMILL_FAULTS=die_on_request=poison`: the process exits at
once (no handler runs) when it admits that request, as a crash in native code would. The count
of deaths lives in the group's commit metadata, so it outlives each worker.
"""

from __future__ import annotations

import asyncio

import pytest

from messages import headers as h
from messages.attempts import read_attempts
from messages.error_codes import ErrorCode
from messages.request import GenerateRequest
from tests.integration.pipeline import (
    WorkerProcess,
    new_lane,
    produce,
    read_all,
    results_by_id,
    wait_committed_to_end,
)

pytestmark = pytest.mark.slow


async def exited(worker: WorkerProcess) -> bool:
    """Whether the worker dies before it has answered (or quarantined) the poison."""
    assert worker.process is not None
    while worker.process.poll() is None:
        if "record_quarantined" in worker.log():
            return False
        await asyncio.sleep(0.2)
    return True


async def test_a_record_that_kills_its_workers_is_quarantined_and_the_rest_is_answered(
    kafka_bootstrap: str, tiny_checkpoints, tmp_path
) -> None:
    lane = await new_lane(kafka_bootstrap, partitions=1)
    goods = [
        GenerateRequest(id=f"good-{i}", prompt_token_ids=[i + 3, 7], max_new_tokens=3)
        for i in range(6)
    ]
    poison = GenerateRequest(id="poison", prompt_token_ids=[5, 6], max_new_tokens=3)
    await produce(lane.bootstrap, lane.requests, [goods[0], poison, *goods[1:]])
    ids = [g.id for g in goods]

    def worker(name: str) -> WorkerProcess:
        return WorkerProcess(
            lane,
            str(tiny_checkpoints["llama"]),
            tmp_path / f"{name}.log",
            ["--max-record-crashes", "1"],
            env={"TOKENMILL_FAULTS": "die_on_request=poison"},
        ).start()

    # The first dies with all 7 records in flight: that pins the death on none of them. The
    # next ones run the suspects in halves (4, 2, 1), each dying in the half with the poison,
    # until one dies running it alone: one death on it, and the next worker quarantines it.
    deaths = 0
    while True:
        survivor = worker(f"w{deaths}")
        if not await exited(survivor):
            break
        assert survivor.wait(timeout=10) == 70, survivor.log()[-3000:]
        deaths += 1
        assert deaths <= 5, "1 + log2(7 suspects) + 1 deaths at most"
    assert deaths >= 2 and "records_isolated" in (tmp_path / "w1.log").read_text()
    third = survivor
    try:
        found = await results_by_id(lane, [*ids, "poison"])
        await wait_committed_to_end(lane)
        assert third.process is not None and third.process.poll() is None, third.log()[-3000:]
    finally:
        assert third.terminate() == 0, third.log()[-3000:]
    (quarantined,) = found["poison"]
    assert quarantined.error is not None and quarantined.error.code is ErrorCode.QUARANTINED
    assert all(r.error is None for i in ids for r in found[i])
    letters = await read_all(lane.bootstrap, lane.dlq, until=1)
    (letter,) = [x for x in letters if dict(x.headers)[h.DLQ_ERROR_CODE] == b"quarantined"]
    assert dict(letter.headers)[h.DLQ_CRASHES] == b"1"
    attempts = read_attempts(letter.headers)  # each death is an attempt
    assert attempts.number == 1 and [e.code for e in attempts.history] == ["worker_died"]
    assert letter.key == b"poison" and b'"poison"' in (letter.value or b"")
    assert "record_quarantined" in third.log()
