"""Retries before the dead-letter queue, with a real broker and a real worker subprocess.

`TOKENMILL_FAULTS=engine_error_on=ID,engine_error_attempts=K` fails request ID in the engine
(`engine_error`, a transient failure) on its first K attempts (every attempt without K). The
request goes through `<requests>.retry.<N>` with its attempt headers; only its final answer
reaches the results topic (with `--exactly-once` too: the retry record rides the partition's
transaction).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from actors.config import retry_topic
from messages import headers as h
from messages.attempts import read_attempts
from messages.error_codes import ErrorCode
from messages.request import GenerateRequest
from tests.integration.pipeline import (
    Lane,
    WorkerProcess,
    decode_results,
    new_lane,
    produce,
    read_all,
    results_by_id,
    wait_committed_to_end,
)

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m"  # the echo engine reads its tokenizer and config, not its weights


def worker(lane: Lane, log: Path, faults: str, *extra: str) -> WorkerProcess:
    args = ["--engine", "echo", "--retry-backoff-ms", "200", *extra]
    return WorkerProcess(lane, MODEL, log, args, env={"TOKENMILL_FAULTS": faults}).start()


def requests(flaky: str, n: int = 5) -> list[GenerateRequest]:
    ids = [f"ok-{i}" for i in range(n)]
    ids.insert(2, flaky)
    return [
        GenerateRequest(id=rid, prompt_token_ids=[i + 3, 7, 9], max_new_tokens=2)
        for i, rid in enumerate(ids)
    ]


EXACTLY_ONCE = pytest.param(["--exactly-once"], id="exactly-once")


@pytest.mark.parametrize("mode", [pytest.param([], id="at-least-once"), EXACTLY_ONCE])
async def test_a_transient_failure_on_the_first_attempt_is_answered_once_by_the_second(
    kafka_bootstrap: str, tmp_path: Path, mode: list[str]
) -> None:
    lane = await new_lane(kafka_bootstrap, partitions=1)
    batch = requests("flaky")
    ids = [r.id for r in batch]
    await produce(lane.bootstrap, lane.requests, batch)
    faults = "engine_error_on=flaky,engine_error_attempts=1"
    w = worker(lane, tmp_path / "w.log", faults, *mode)
    try:
        found = await results_by_id(lane, ids)
        await wait_committed_to_end(lane)
    finally:
        assert w.terminate() == 0, w.log()[-3000:]
    assert all(r.error is None for rs in found.values() for r in rs), w.log()[-3000:]
    records = await read_all(lane.bootstrap, lane.results, until=len(ids) + 1, within_s=3)
    assert sorted(r.id for r in decode_results(records)) == sorted(ids), "a retry is no result"
    (answer,) = [r for r in records if r.key == b"flaky"]
    assert h.header(answer.headers, h.ATTEMPT) == b"2", "answered by its second attempt"

    (retry,) = await read_all(lane.bootstrap, retry_topic(lane.requests, 1), until=1)
    attempts = read_attempts(retry.headers)
    assert attempts.number == 2 and attempts.not_before_ms is not None
    (failure,) = attempts.history
    assert (failure.attempt, failure.code) == (1, ErrorCode.ENGINE_ERROR.value)
    assert "injected engine error" in failure.message
    assert retry.key == b"flaky"
    assert "request_retried" in w.log() and "request_dead_lettered" not in w.log()


async def test_a_request_failing_on_every_attempt_is_dead_lettered_with_its_history(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    lane = await new_lane(kafka_bootstrap, partitions=1)
    batch = requests("doomed")
    ids = [r.id for r in batch]
    await produce(lane.bootstrap, lane.requests, batch)
    w = worker(lane, tmp_path / "w.log", "engine_error_on=doomed", "--max-attempts", "3")
    try:
        found = await results_by_id(lane, ids)
        letters = await read_all(lane.bootstrap, lane.dlq, until=1)
    finally:
        assert w.terminate() == 0, w.log()[-3000:]
    (answer,) = found["doomed"]
    assert answer.error is not None and answer.error.code is ErrorCode.ENGINE_ERROR
    assert all(r.error is None for i in ids if i != "doomed" for r in found[i])
    records = await read_all(lane.bootstrap, lane.results, until=len(ids) + 1, within_s=3)
    assert len(records) == len(ids), "one answer each: the two retries are not results"

    (letter,) = letters
    assert letter.key == b"doomed" and b'"doomed"' in (letter.value or b"")
    assert h.header(letter.headers, h.DLQ_ERROR_CODE) == b"engine_error"
    attempts = read_attempts(letter.headers)
    assert attempts.number == 3, "dead-lettered after --max-attempts"
    assert [(e.attempt, e.code) for e in attempts.history] == [
        (1, "engine_error"), (2, "engine_error"), (3, "engine_error")
    ]  # fmt: skip
    for n in (1, 2):
        (retry,) = await read_all(lane.bootstrap, retry_topic(lane.requests, n), until=1)
        assert read_attempts(retry.headers).number == n + 1
    assert w.log().count("request_retried") == 2 and "request_dead_lettered" in w.log()
