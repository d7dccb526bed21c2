"""A broker away for longer than the producer's delivery timeout: the worker waits for it.

The broker of this module is its own (the session's is shared by every test): it is stopped
while a real worker subprocess has results to send, kept down until the worker has seen its
sends time out, and started again on the same port and data. The worker must still be alive
and answer every request (duplicates only for what was in flight), without a restart.

A broker killed outright (SIGKILL) under a steady stream of requests: /readyz says 503 with
since when the broker is unreachable, and 200 again once it is back; stderr stays a bounded
number of JSON lines meanwhile.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Iterator

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from messages.request import GenerateRequest
from ops.services.kafka import LocalKafka
from ops.services.local_process import free_port, wait_exit
from tests.integration.conftest import local_broker
from tests.integration.pipeline import (
    Lane,
    WorkerProcess,
    new_lane,
    produce,
    request_codec,
    results_by_id,
)
from tests.integration.test_supervision import readiness

pytestmark = pytest.mark.slow


@pytest.fixture
def own_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    with local_broker(tmp_path_factory.mktemp("outage-kafka")) as broker:
        yield broker


async def test_a_long_broker_outage_loses_nothing_and_stops_no_worker(
    own_broker: LocalKafka, tiny_checkpoints, tmp_path
) -> None:
    lane = await new_lane(own_broker.bootstrap, partitions=1)
    requests = [
        GenerateRequest(id=f"r{i}", prompt_token_ids=[i + 3, 7, 9], max_new_tokens=64)
        for i in range(60)
    ]
    ids = [r.id for r in requests]
    await produce(lane.bootstrap, lane.requests, requests)
    worker = WorkerProcess(
        lane,
        str(tiny_checkpoints["llama"]),
        tmp_path / "worker.log",
        ["--max-num-seqs", "2", "--delivery-timeout-ms", "3000", "--max-restarts", "1"],
    ).start()
    try:
        await worker.wait_for_log("partitions_assigned")
        await results_by_id(lane, ids[:1])  # it is answering
        assert own_broker.stop() is not None
        # Longer than the delivery timeout: sends fail, and are sent again later. They fail
        # by timing out, or (when the last metadata the producer got came from a broker
        # shutting down, which a busy machine makes likely) at once, for want of a leader.
        await worker.wait_for_log("send_retrying", within_s=180)
        await worker.wait_for_log(("KafkaTimeoutError", "LeaderNotAvailableError"), within_s=180)
        assert own_broker.start(timeout=120)
        found = await results_by_id(lane, ids, within_s=300)
        assert set(found) == set(ids), sorted(set(ids) - set(found))
        assert all(r.error is None for results in found.values() for r in results)
        assert worker.process is not None and worker.process.poll() is None, worker.log()[-3000:]
    finally:
        code = worker.terminate()
    log = worker.log()
    assert code == 0, log[-3000:]
    assert "child_crashed" not in log and "worker_giving_up" not in log, log[-3000:]


async def test_a_worker_started_before_its_broker_waits_for_it(
    own_broker: LocalKafka, tiny_checkpoints, tmp_path
) -> None:
    lane = await new_lane(own_broker.bootstrap, partitions=1)
    assert own_broker.stop() is not None
    worker = WorkerProcess(
        lane, str(tiny_checkpoints["llama"]), tmp_path / "worker.log", ["--max-restarts", "1"]
    ).start()
    try:
        for client in ("ingest", "emitter"):
            await worker.wait_for_log(f'"client": "{client}", "error"', within_s=180)
        assert own_broker.start(timeout=120)
        requests = [GenerateRequest(id=f"r{i}", prompt_token_ids=[i + 3], max_new_tokens=2)
                    for i in range(5)]  # fmt: skip
        await produce(lane.bootstrap, lane.requests, requests)
        found = await results_by_id(lane, [r.id for r in requests], within_s=300)
        assert all(found[r.id][0].error is None for r in requests)
    finally:
        code = worker.terminate()
    assert code == 0, worker.log()[-3000:]
    assert "child_crashed" not in worker.log(), worker.log()[-3000:]


class RequestStream:
    """Requests at a steady rate until `stop`; each one sent again until the broker has it."""

    RATE_S = 0.1  # between two requests: the stream's pace, not a wait for anything

    def __init__(self, lane: Lane) -> None:
        self.lane = lane
        self.ids: list[str] = []
        self.failed_sends = 0
        self.stop = asyncio.Event()

    async def run(self) -> None:
        producer = AIOKafkaProducer(
            bootstrap_servers=self.lane.bootstrap, acks="all", request_timeout_ms=5000
        )
        await producer.start()
        try:
            deliveries = []
            while not self.stop.is_set():
                request = GenerateRequest(
                    id=f"s{len(self.ids)}", prompt_token_ids=[len(self.ids) % 50 + 3, 7],
                    max_new_tokens=16,
                )  # fmt: skip
                self.ids.append(request.id)
                deliveries.append(asyncio.create_task(self._deliver(producer, request)))
                await asyncio.sleep(self.RATE_S)
            await asyncio.gather(*deliveries)
        finally:
            await producer.stop()

    async def _deliver(self, producer: AIOKafkaProducer, request: GenerateRequest) -> None:
        value = request_codec.encode(request)
        while True:
            try:
                await (await producer.send(self.lane.requests, value, key=request.id.encode()))
                return
            except KafkaError:  # the broker is away: its batch expired; send it again
                self.failed_sends += 1


def unreachable(status: int, details: dict[str, object]) -> bool:
    return status == 503 and str(details.get("kafka", "")).startswith("unreachable since ")


def ready(status: int, details: dict[str, object]) -> bool:
    return status == 200 and details.get("kafka") == "reachable"


def log_lines(worker: WorkerProcess) -> list[str]:
    return worker.log().splitlines()


def event_of(line: str) -> str:
    try:
        return str(json.loads(line)["event"])
    except (ValueError, KeyError, TypeError):
        raise AssertionError(f"not a JSON log line: {line!r}") from None


async def test_a_killed_broker_makes_the_worker_unready_until_it_is_back(
    own_broker: LocalKafka, tiny_checkpoints, tmp_path
) -> None:
    lane = await new_lane(own_broker.bootstrap, partitions=1)
    port = free_port()
    worker = WorkerProcess(
        lane,
        str(tiny_checkpoints["llama"]),
        tmp_path / "worker.log",
        ["--http-port", str(port), "--max-num-seqs", "8", "--max-restarts", "1"],
    ).start()
    stream = RequestStream(lane)
    producing: asyncio.Task[None] | None = None
    try:
        await readiness(worker, port, ready, within_s=180)
        producing = asyncio.create_task(stream.run())
        await results_by_id(lane, ["s0"], within_s=120)  # it is answering the stream
        pid = own_broker.pid
        assert pid is not None
        before = len(log_lines(worker))
        killed_at = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        assert await asyncio.to_thread(wait_exit, pid, 30.0)
        down = await readiness(worker, port, unreachable, within_s=120)
        noticed_s = time.monotonic() - killed_at
        assert down["consuming"] is True  # what /readyz said alone before: not enough
        restarting_at = time.monotonic()
        assert await asyncio.to_thread(own_broker.start, 120)  # same port, same data
        back_at = time.monotonic()
        during_outage = log_lines(worker)[before:]
        await readiness(worker, port, ready, within_s=180)
        ready_s = time.monotonic() - back_at
        stream.stop.set()
        await asyncio.wait_for(producing, 180)  # every request the stream made is delivered
        found = await results_by_id(lane, stream.ids, within_s=300)
        assert set(found) == set(stream.ids), sorted(set(stream.ids) - set(found))
        assert all(r.error is None for results in found.values() for r in results)
        assert worker.process is not None and worker.process.poll() is None, worker.log()[-3000:]
    finally:
        if producing is not None and not producing.done():
            producing.cancel()
        code = worker.terminate()
    log = worker.log()
    assert code == 0, log[-3000:]
    assert "child_crashed" not in log and "worker_giving_up" not in log, log[-3000:]
    events = [event_of(line) for line in log.splitlines()]  # stdout and stderr alike
    duplicates = sum(len(results) - 1 for results in found.values())
    print(
        f"\nbroker outage: down {back_at - killed_at:.1f} s (restart took "
        f"{back_at - restarting_at:.1f} s); /readyz 503 {noticed_s:.1f} s after the kill, "
        f"200 {ready_s:.1f} s after the broker was back; {len(stream.ids)} requests "
        f"({stream.failed_sends} sends failed and made again), {duplicates} duplicate results; "
        f"{len(during_outage)} worker log lines while down "
        f"(kafka_unreachable x{events.count('kafka_unreachable')}, "
        f"kafka_reachable x{events.count('kafka_reachable')})"
    )
    assert len(during_outage) < 200, "\n".join(during_outage[-50:])
    assert "kafka_unreachable" in events and "kafka_reachable" in events


async def test_a_connect_timeout_makes_a_worker_without_broker_exit_1_saying_so(
    tiny_checkpoints, tmp_path
) -> None:
    """`--connect-timeout`: the operator wants a worker that finds no broker to fail, not wait."""
    nowhere = Lane(
        bootstrap=f"127.0.0.1:{free_port()}",  # nothing listens there
        requests="never.requests",
        results="never.results",
        dlq="never.dlq",
        group="never",
        partitions=1,
    )
    worker = WorkerProcess(
        nowhere,
        str(tiny_checkpoints["llama"]),
        tmp_path / "worker.log",
        ["--connect-timeout", "3", "--max-restarts", "5"],
    ).start()
    try:
        code = await asyncio.to_thread(worker.wait, 180)
    finally:
        worker.close()
    log = worker.log()
    assert code == 1, log[-3000:]
    assert "no broker answered within 3 s" in log and "kafka_unusable" in log, log[-3000:]
    assert "child_restarted" not in log, log[-3000:]
