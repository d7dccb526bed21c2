"""Exactly-once results (`tokenmill worker --exactly-once`) with real worker subprocesses on the
real broker, counted by a read_committed consumer: whatever crashes, pauses and rebalances
happen, each request's result is seen once.

The same chaos without `--exactly-once` shows what it prevents: the duplicates of
at-least-once (printed, not asserted: how many depends on the moment of each fault).
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from actors.transactions.answered import split
from messages.request import GenerateRequest
from ops.services.kafka import LocalKafka
from tests.integration.conftest import local_broker
from tests.integration.pipeline import (
    Lane,
    WorkerProcess,
    commits,
    every_result,
    new_lane,
    produce,
    request_codec,
    wait_committed_to_end,
)
from tests.integration.test_membership import MODEL, Answers, request, wait_until, worker

pytestmark = pytest.mark.slow

EXACTLY_ONCE = ["--exactly-once", "--session-timeout-ms", "6000", "--shutdown-timeout", "20"]


class Committed(Answers):
    """Every result a read_committed consumer sees on the lane's results topic, by id."""

    def __init__(self, lane: Lane) -> None:
        super().__init__(lane, isolation="read_committed")

    def has(self, ids: list[str]) -> bool:
        return all(i in self.by_id for i in ids)


async def test_results_and_offsets_commit_in_one_transaction_per_partition(
    kafka_bootstrap: str, smollm2_path: Path, tmp_path: Path
) -> None:
    lane = await new_lane(kafka_bootstrap, partitions=3)
    a = worker(lane, tmp_path / "a.log", "a", *EXACTLY_ONCE)
    try:
        await a.wait_for_log("partitions_assigned", within_s=180)
        wanted = [request("r", i) for i in range(300)]
        async with Committed(lane) as seen:
            await produce(lane.bootstrap, lane.requests, wanted)
            await wait_until("every result", lambda: seen.has([r.id for r in wanted]))
            done = await wait_committed_to_end(lane, within_s=60)
        metadata = {p: c.metadata for p, c in (await commits(lane)).items()}
    finally:
        code = a.terminate()
    assert code == 0, a.log()[-3000:]
    assert "Traceback" not in a.log()
    assert all(len(rs) == 1 for rs in seen.by_id.values())
    assert all(r.error is None for rs in seen.by_id.values() for r in rs)
    assert "lane_opened" in a.log()
    # The offsets went in the transactions, with the crash guard's metadata: released at the end.
    assert sum(done.values()) == len(wanted)
    assert all(split(m, 0)[0].startswith("tokenmill/1") for m in metadata.values()), metadata


async def send_steadily(lane: Lane, requests: list[GenerateRequest], every_s: float) -> None:
    """The requests, one every `every_s` (a pace, so that the faults land mid-stream)."""
    producer = AIOKafkaProducer(bootstrap_servers=lane.bootstrap, acks="all", linger_ms=2)
    await producer.start()
    try:
        acks = []
        for r in requests:
            acks.append(await producer.send(
                lane.requests, request_codec.encode(r), key=r.id.encode()
            ))  # fmt: skip
            await asyncio.sleep(every_s)
        await asyncio.gather(*acks)
    finally:
        await producer.stop()


def assigned_after(process: WorkerProcess, mark: int) -> bool:
    return "partitions_assigned" in "\n".join(process.log().splitlines()[mark:])


@pytest.mark.parametrize("exactly_once", [True, False], ids=["exactly-once", "at-least-once"])
async def test_kill_9_and_a_zombie_leave_every_result_seen_exactly_once(
    kafka_bootstrap: str, smollm2_path: Path, tmp_path: Path, exactly_once: bool
) -> None:
    lane = await new_lane(kafka_bootstrap, partitions=6)
    args = EXACTLY_ONCE if exactly_once else EXACTLY_ONCE[1:]
    a, b, c = (worker(lane, tmp_path / f"{n}.log", n, *args) for n in "abc")
    a2: WorkerProcess | None = None
    stopped = False
    wanted = [request("x", i) for i in range(2000)]
    try:
        for w in (a, b, c):
            await w.wait_for_log("partitions_assigned", within_s=180)
        async with Committed(lane) as seen:
            sending = asyncio.create_task(send_steadily(lane, wanted, every_s=0.012))
            await wait_until("a's first answers", lambda: seen.by("a") >= 50)
            assert a.kill() == -signal.SIGKILL  # mid-stream, with records in flight
            a2 = worker(lane, tmp_path / "a2.log", "a2", *args)
            await wait_until("a2 to answer", lambda: seen.by("a2") >= 20, within_s=180)

            marks = {w.log_path.name: len(w.log().splitlines()) for w in (c, a2)}
            os.kill(b.pid, signal.SIGSTOP)  # past its session: its partitions move on
            stopped = True
            await wait_until(
                "the others to take b's partitions",
                lambda: assigned_after(c, marks["c.log"]) and assigned_after(a2, marks["a2.log"]),
            )
            os.kill(b.pid, signal.SIGCONT)  # the zombie wakes with what it held
            stopped = False
            await sending
            await wait_until("every result", lambda: seen.has([r.id for r in wanted]), 240)
            await wait_committed_to_end(lane, within_s=120)
    finally:
        if stopped:
            os.kill(b.pid, signal.SIGCONT)
        codes = [w.terminate() for w in (b, c, *([a2] if a2 else []))]
        a.close()
    found = await every_result(lane, "read_committed")
    logs = "".join(w.log()[-2000:] for w in (b, c, *([a2] if a2 else [])))
    assert codes == [0] * len(codes), logs
    missing = {r.id for r in wanted} - found.keys()
    assert not missing, f"lost: {sorted(missing)[:10]}"
    duplicates = {i: [r.worker for r in rs] for i, rs in found.items() if len(rs) > 1}
    print(f"\n{'exactly-once' if exactly_once else 'at-least-once'}: {len(wanted)} requests, "
          f"kill -9 + zombie: {len(duplicates)} answered twice or more")  # fmt: skip
    if exactly_once:
        assert duplicates == {}, f"{len(duplicates)} duplicates: {list(duplicates.items())[:5]}"
        assert all(r.error is None for rs in found.values() for r in rs)


@pytest.fixture
def own_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    with local_broker(tmp_path_factory.mktemp("eos-kafka")) as broker:
        yield broker


@pytest.mark.skip(
    reason="quarantined 2026-12-07: in full-suite runs (2 of the last 3) one exactly-once worker "
    "falls silent after the broker restart (no fetch, no transaction, no heartbeat logged for "
    "5 minutes; 111 outcomes of one partition unanswered) and then ignores SIGTERM; passes alone "
    "(24 of 24 runs, under load too). Open: see the stop 60 and 61 notes."
)
async def test_a_broker_restart_mid_stream_leaves_every_result_seen_exactly_once(
    own_broker: LocalKafka, smollm2_path: Path, tmp_path: Path
) -> None:
    lane = await new_lane(own_broker.bootstrap, partitions=3)
    args = [*EXACTLY_ONCE, "--delivery-timeout-ms", "5000", "--max-restarts", "20"]
    a, b = (worker(lane, tmp_path / f"{n}.log", n, *args) for n in "ab")
    first = [request("before", i) for i in range(300)]
    after = [request("after", i) for i in range(300)]
    wanted = [r.id for r in [*first, *after]]
    seen = Committed(lane)
    try:
        for w in (a, b):
            await w.wait_for_log("partitions_assigned", within_s=180)
        await produce(lane.bootstrap, lane.requests, first)
        async with Committed(lane) as seen:
            await wait_until("some answers", lambda: len(seen.by_id) >= 50)
        assert own_broker.stop() is not None  # mid-stream: transactions open, results in flight
        assert own_broker.start(timeout=120)
        await produce(lane.bootstrap, lane.requests, after)
        async with Committed(lane) as seen:
            await wait_until("every result", lambda: seen.has(wanted), within_s=300)
        await wait_committed_to_end(lane, within_s=120)
    except AssertionError as exc:  # which (the workers' logs follow the failure: conftest.py)
        missing = sorted(set(wanted) - set(seen.by_id))
        raise AssertionError(f"{exc}: {len(missing)} missing, {missing[:5]}") from exc
    finally:
        codes = [w.terminate() for w in (a, b)]
    found = await every_result(lane, "read_committed")
    assert codes == [0, 0], a.log()[-2000:] + b.log()[-2000:]
    assert set(found) == set(wanted)
    duplicates = {i: [r.worker for r in rs] for i, rs in found.items() if len(rs) > 1}
    assert duplicates == {}, f"{len(duplicates)} duplicates: {list(duplicates.items())[:5]}"


def seeded(i: int) -> GenerateRequest:
    return GenerateRequest(
        id=f"seeded-{i}",
        prompt=f"Write a short line about the number {i}.",
        max_new_tokens=8,
        temperature=0.9,
        top_p=0.95,
        seed=1000 + i,
    )


async def test_a_replayed_seeded_request_answers_the_tokens_of_a_clean_run(
    kafka_bootstrap: str, smollm2_path: Path, tmp_path: Path
) -> None:
    """A worker dies (as a crash in native code would kill it) with seeded sampled requests in
    flight; the one that answers them again gives each the tokens a clean run gives it,
    although they ran in other batches."""
    wanted = [seeded(i) for i in range(12)]
    die = GenerateRequest(id="die", prompt_token_ids=[3, 7, 9], max_new_tokens=2)
    clean_lane = await new_lane(kafka_bootstrap, partitions=1)
    lane = await new_lane(kafka_bootstrap, partitions=1)
    clean = WorkerProcess(clean_lane, MODEL, tmp_path / "clean.log", EXACTLY_ONCE).start()
    try:
        await produce(clean_lane.bootstrap, clean_lane.requests, wanted)
        async with Committed(clean_lane) as reference:
            await wait_until("the clean run", lambda: reference.has([r.id for r in wanted]), 600)
    finally:
        assert clean.terminate() == 0, clean.log()[-3000:]

    # The doomed worker admits half the requests, then the one it dies on, with them running.
    doomed = WorkerProcess(lane, MODEL, tmp_path / "doomed.log", EXACTLY_ONCE,
                           env={"TOKENMILL_FAULTS": "die_on_request=die"}).start()  # fmt: skip
    await produce(lane.bootstrap, lane.requests, [*wanted[:6], die, *wanted[6:]])
    assert doomed.wait(timeout=600) == 70, doomed.log()[-3000:]
    survivor = WorkerProcess(lane, MODEL, tmp_path / "survivor.log", EXACTLY_ONCE).start()
    try:
        async with Committed(lane) as seen:
            await wait_until("the replay", lambda: seen.has([r.id for r in wanted]), 600)
    finally:
        assert survivor.terminate() == 0, survivor.log()[-3000:]
    found = await every_result(lane, "read_committed")
    for r in wanted:
        [again], [first] = found[r.id], reference.by_id[r.id]
        assert again.token_ids == first.token_ids, r.id
    assert all(len(rs) == 1 for rs in found.values())
