"""A broker away for longer than the producer's delivery timeout: the worker waits for it.

The broker of this module is its own (the session's is shared by every test): it is stopped
while a real worker subprocess has results to send, kept down until the worker has seen its
sends time out, and started again on the same port and data. The worker must still be alive
and answer every request (duplicates only for what was in flight), without a restart.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from messages.request import GenerateRequest
from ops.services.kafka import LocalKafka
from tests.integration.conftest import local_broker
from tests.integration.pipeline import WorkerProcess, new_lane, produce, results_by_id

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
