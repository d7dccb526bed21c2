"""Group membership with real worker subprocesses: static members restarted in place, and a
zombie (a worker frozen past its session) that comes back.

Static membership (KIP-345): a worker restarted under the same `--group-instance-id` within
the session timeout gets its partitions back, and no other worker's assignment moves.

A zombie: a worker stopped (SIGSTOP) past its session loses its partitions to the others;
resumed, it must not commit offsets for what it lost, and nothing may be lost meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from messages.request import GenerateRequest
from messages.result import GenerateResult
from tests.integration.pipeline import (
    Lane,
    WorkerProcess,
    committed,
    decode_results,
    end_offsets,
    new_lane,
    produce,
    request_codec,
    results_by_id,
    wait_committed_to_end,
)

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m"  # the echo engine reads its tokenizer and config, not its weights


def worker(lane: Lane, log: Path, name: str, *extra: str) -> WorkerProcess:
    args = ["--engine", "echo", "--worker-id", name, *extra]
    return WorkerProcess(lane, MODEL, log, args).start()


def request(prefix: str, i: int) -> GenerateRequest:
    return GenerateRequest(
        id=f"{prefix}{i}", prompt_token_ids=[i % 300 + 3, 7, 9], max_new_tokens=2
    )


def requests(prefix: str, n: int) -> list[GenerateRequest]:
    return [request(prefix, i) for i in range(n)]


def events(process: WorkerProcess, name: str, since: int = 0) -> list[dict[str, Any]]:
    """The worker's log events called `name`, from line `since` on."""
    out = []
    for line in process.log().splitlines()[since:]:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and event.get("event") == name:
            out.append(event)
    return out


def lines(process: WorkerProcess) -> int:
    return len(process.log().splitlines())


async def wait_until(what: str, ready: Callable[[], bool], within_s: float = 180.0) -> None:
    deadline = time.monotonic() + within_s
    while not ready():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.2)


async def logged(
    process: WorkerProcess, name: str, since: int, within_s: float = 180.0
) -> dict[str, Any]:
    """Until the worker logs an event called `name` past line `since`; that event."""
    what = f"{name} in {process.log_path.name}"
    await wait_until(what, lambda: bool(events(process, name, since)), within_s)
    return events(process, name, since)[0]


def assignment(process: WorkerProcess, since: int = 0) -> set[str] | None:
    """The partitions of the worker's last `partitions_assigned`, if it logged one."""
    assigned = events(process, "partitions_assigned", since)
    if not assigned:
        return None
    # The requests topic's: the retry topics' partitions are assigned too.
    return {p for p in assigned[-1]["partitions"] if ".retry." not in p}


def exited(*processes: WorkerProcess) -> str:
    return "".join(
        f"\n--- {p.log_path.name}:\n{p.log()[-3000:]}"
        for p in processes
        if p.process is not None and p.process.poll() is not None
    )


async def settled(a: WorkerProcess, b: WorkerProcess, lane: Lane) -> tuple[set[str], set[str]]:
    """Until both workers hold a share of the partitions and together all of them."""
    every = {f"{lane.requests}/{p}" for p in range(lane.partitions)}

    def split() -> bool:
        if exited(a, b):
            raise AssertionError(f"a worker exited:{exited(a, b)}")
        ours, theirs = assignment(a), assignment(b)
        return bool(ours and theirs and ours | theirs == every and not ours & theirs)

    await wait_until("both workers to share the partitions", split)
    return assignment(a) or set(), assignment(b) or set()


async def test_a_static_member_restarted_gets_its_partitions_back_and_nobody_else_moves(
    kafka_bootstrap: str, smollm2_path: Path, tmp_path: Path
) -> None:
    lane = await new_lane(kafka_bootstrap, partitions=4)
    # Long enough for a restart on a busy machine; a member gone past it is rebalanced away.
    static = ["--session-timeout-ms", "60000", "--shutdown-timeout", "10"]
    # A joins first, so it is the group's leader: the harder restart (KIP-814), since a
    # rejoining leader is told it leads, and must not make the group rebalance.
    a = worker(lane, tmp_path / "a.log", "a", "--group-instance-id", "a", *static)
    b: WorkerProcess | None = None
    a2: WorkerProcess | None = None
    try:
        await a.wait_for_log("partitions_assigned", within_s=180)
        b = worker(lane, tmp_path / "b.log", "b", "--group-instance-id", "b", *static)
        ours, theirs = await settled(a, b, lane)
        mark = lines(b)
        before, during, after = (
            requests("before", 40),
            requests("during", 40),
            requests("after", 40),
        )
        await produce(lane.bootstrap, lane.requests, before)
        await results_by_id(lane, [r.id for r in before], within_s=120)

        t0 = time.monotonic()
        assert a.terminate() == 0, a.log()[-3000:]
        await produce(lane.bootstrap, lane.requests, during)
        a2 = worker(lane, tmp_path / "a2.log", "a", "--group-instance-id", "a", *static)
        await a2.wait_for_log("partitions_assigned", within_s=180)
        rejoined_s = time.monotonic() - t0
        await produce(lane.bootstrap, lane.requests, after)
        ids = [r.id for r in [*before, *during, *after]]
        found = await results_by_id(lane, ids, within_s=180)
        await wait_committed_to_end(lane, within_s=60)
    finally:
        a.close()
        b_code = b.terminate() if b is not None else None
        a2_code = a2.terminate() if a2 is not None else None
    print(f"static member back in {rejoined_s:.1f}s, {ours=} {theirs=}")

    assert b_code == 0 and a2_code == 0, b.log()[-3000:]
    assert "Traceback" not in a.log() + a2.log() + b.log()
    assert assignment(a2) == ours, "the restarted member got its own partitions back"
    assert events(b, "partitions_revoked", mark) == [], "the other member never gave any up"
    assert events(b, "partitions_assigned", mark) == [], "nor was it handed any"
    assert set(found) == set(ids), f"missing: {sorted(set(ids) - set(found))[:10]}"
    assert all(r.error is None for rs in found.values() for r in rs)
    assert all(len(rs) == 1 for rs in found.values()), "a drain and a restart: no duplicates"
    # What waited for the restarted member was answered by it: its partitions never moved.
    answered = {r.worker for req in during for r in found[req.id]}
    assert answered == {"a", "b"}, answered


class Answers:
    """Every result on the lane's results topic as it arrives, read by a background task."""

    def __init__(self, lane: Lane, isolation: str = "read_uncommitted") -> None:
        self.lane = lane
        self.isolation = isolation
        self.by_id: dict[str, list[GenerateResult]] = defaultdict(list)
        self.at: dict[str, list[float]] = {}
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Answers:
        consumer = AIOKafkaConsumer(
            self.lane.results,
            bootstrap_servers=self.lane.bootstrap,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            isolation_level=self.isolation,
        )
        await consumer.start()
        self.task = asyncio.create_task(self._read(consumer))
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.task is not None
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task

    async def _read(self, consumer: AIOKafkaConsumer) -> None:
        try:
            while True:
                fetched = await consumer.getmany(timeout_ms=500)
                for result in decode_results(r for batch in fetched.values() for r in batch):
                    self.by_id[result.id].append(result)
                    self.at.setdefault(result.id, []).append(time.monotonic())
        finally:
            await consumer.stop()

    def by(self, worker: str) -> int:
        return sum(r.worker == worker for rs in self.by_id.values() for r in rs)


class Stream:
    """A steady stream of requests, each one's partition and offset on record; `pause()`
    holds it (once the send under way is acknowledged), `resume()` lets it flow again."""

    def __init__(self, lane: Lane, every_s: float = 0.03) -> None:
        self.lane = lane
        self.every_s = every_s
        self.sent: dict[str, tuple[int, int]] = {}  # id -> (partition, offset)
        self.stopping = asyncio.Event()
        self.flowing = asyncio.Event()
        self.held = asyncio.Event()  # set while paused and no send is under way
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Stream:
        self.flowing.set()
        self.task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def pause(self) -> None:
        self.flowing.clear()
        await self.held.wait()

    def answered(self, answers: Answers, partitions: set[int] | None = None) -> bool:
        """Whether every request sent (to `partitions`, or to any) has a result."""
        return all(
            i in answers.by_id
            for i, (p, _) in self.sent.items()
            if partitions is None or p in partitions
        )

    def resume(self) -> None:
        self.held.clear()
        self.flowing.set()

    async def stop(self) -> list[str]:
        """Stop sending; the ids of every request sent."""
        self.stopping.set()
        self.flowing.set()
        assert self.task is not None
        await self.task
        return list(self.sent)

    async def _run(self) -> None:
        producer = AIOKafkaProducer(bootstrap_servers=self.lane.bootstrap, acks="all")
        await producer.start()
        try:
            i = 0
            while not self.stopping.is_set():
                if not self.flowing.is_set():
                    self.held.set()
                    await self.flowing.wait()
                    continue
                r = request("z", i)
                sent = await producer.send_and_wait(
                    self.lane.requests, request_codec.encode(r), key=r.id.encode()
                )
                self.sent[r.id] = (sent.partition, sent.offset)
                i += 1
                # A pace, not a wait for an event: the stream runs through its phases.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stopping.wait(), self.every_s)
        finally:
            await producer.stop()


class Commits:
    """Polls the group's committed offsets and notes any that went backwards."""

    def __init__(self, lane: Lane) -> None:
        self.lane = lane
        self.last: dict[int, int] = {}
        self.backwards: list[tuple[int, int, int]] = []  # (partition, from, to)
        self.polls = 0
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Commits:
        admin = AIOKafkaAdminClient(bootstrap_servers=self.lane.bootstrap)
        await admin.start()
        self.task = asyncio.create_task(self._poll(admin))
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.task is not None
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task

    async def _poll(self, admin: AIOKafkaAdminClient) -> None:
        try:
            while True:
                offsets = await admin.list_consumer_group_offsets(self.lane.group)
                for tp, meta in offsets.items():
                    if tp.topic != self.lane.requests:
                        continue
                    was = self.last.get(tp.partition, -1)
                    if meta.offset < was:
                        self.backwards.append((tp.partition, was, meta.offset))
                    self.last[tp.partition] = max(was, meta.offset)
                self.polls += 1
                await asyncio.sleep(0.02)
        finally:
            await admin.close()


async def test_a_zombie_worker_loses_its_partitions_and_commits_nothing_for_them(
    kafka_bootstrap: str, smollm2_path: Path, tmp_path: Path
) -> None:
    lane = await new_lane(kafka_bootstrap, partitions=2)
    dynamic = ["--session-timeout-ms", "6000", "--shutdown-timeout", "10"]
    a = worker(lane, tmp_path / "a.log", "a", *dynamic)
    b = worker(lane, tmp_path / "b.log", "b", *dynamic)
    every = {f"{lane.requests}/{p}" for p in range(lane.partitions)}
    stopped = False
    try:
        ours, _ = await settled(a, b, lane)
        lost = {int(p.rsplit("/", 1)[1]) for p in ours}
        async with Answers(lane) as answers, Stream(lane) as stream:
            await wait_until("the doomed worker to answer some", lambda: answers.by("a") >= 20)

            os.kill(a.pid, signal.SIGSTOP)
            stopped, t_stop, mark_b = True, time.monotonic(), lines(b)
            ends_at_stop = await end_offsets(lane)  # A can have fetched nothing past these
            at_stop = await committed(lane)  # A's last commits: it cannot commit now
            # A rebalance (eager) has its members read again what they had in flight: the
            # stream holds while one runs, so that every duplicate is one of A's.
            await stream.pause()
            kept = set(range(lane.partitions)) - lost
            await wait_until("B to answer its share", lambda: stream.answered(answers, kept))
            await wait_until("the other worker to take every partition",
                             lambda: assignment(b, mark_b) == every, within_s=120)  # fmt: skip
            takeover_s = time.monotonic() - t_stop
            stream.resume()
            taken = answers.by("b")
            await wait_until("the other worker to answer A's share too",
                             lambda: answers.by("b") >= taken + 40)  # fmt: skip
            # B answers and commits everything before the zombie wakes: a commit of A's, were
            # one let through, would move an offset backwards.
            await stream.pause()
            await wait_until("every request's result", lambda: stream.answered(answers))
            await wait_committed_to_end(lane, within_s=60)

            async with Commits(lane) as commits:
                await wait_until("the first commit poll", lambda: commits.polls > 0)
                mark_a = lines(a)
                os.kill(a.pid, signal.SIGCONT)
                stopped, t_cont = False, time.monotonic()
                await logged(a, "partitions_assigned", mark_a, within_s=120)
                rejoin_s = time.monotonic() - t_cont
                stream.resume()
                answered = answers.by("a")
                await wait_until("the zombie, back in the group, to answer again",
                                 lambda: answers.by("a") > answered)  # fmt: skip
                ids = await stream.stop()
                await wait_until("every request's result", lambda: stream.answered(answers))
                done = await wait_committed_to_end(lane, within_s=60)
            found = dict(answers.by_id)
    finally:
        if stopped:
            os.kill(a.pid, signal.SIGCONT)
        a_code, b_code = a.terminate(), b.terminate()
    assert a_code == 0 and b_code == 0, a.log()[-3000:] + b.log()[-3000:]
    assert "Traceback" not in a.log() + b.log()

    assert set(found) == set(ids), f"missing: {sorted(set(ids) - set(found))[:10]}"
    assert all(r.error is None for rs in found.values() for r in rs)
    assert commits.backwards == [], f"commits went backwards: {commits.backwards}"
    assert done == await end_offsets(lane)
    # Back from the stop, the zombie tried to commit what it had lost, and was refused.
    fenced = {p for e in events(a, "commit_fenced", mark_a) for p in e["partitions"]}
    assert fenced & ours, f"no refused commit of {ours} after the SIGCONT"

    # Duplicates only for what A had fetched before it stopped and not committed: nothing
    # it fetched after the SIGCONT, for partitions no longer its own, ran.
    in_flight = {
        i for i, (p, offset) in stream.sent.items()
        if p in lost and at_stop.get(p, -1) <= offset < ends_at_stop[p]
    }  # fmt: skip
    duplicates = {i: sorted(r.worker for r in rs) for i, rs in found.items() if len(rs) > 1}
    dropped = sum(e["records"] for e in events(a, "fetch_dropped_fenced", mark_a))
    print(
        f"\ntakeover {takeover_s:.1f}s after SIGSTOP; zombie back in the group {rejoin_s:.1f}s "
        f"after SIGCONT; {len(ids)} requests, {len(in_flight)} in flight in A at SIGSTOP, "
        f"{len(duplicates)} duplicates; records the zombie fetched and dropped: {dropped}"
    )
    extra = {i: (stream.sent[i], duplicates[i], answers.at[i]) for i in set(duplicates) - in_flight}
    assert not extra, f"duplicates beyond what A had in flight: {extra} (t_cont {t_cont})"
    assert all(workers == ["a", "b"] for workers in duplicates.values()), duplicates
