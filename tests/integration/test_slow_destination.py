"""One slow destination never blocks the rest: requests whose reply topic is gone wait for it
on their own, bounded, while a steady stream of other requests flows; then they are answered
on the results topic instead (`reply_to_refused`), their requests dead-lettered.

The worker (a real subprocess, the echo engine) learns of the reply topic before it is deleted:
its reply-topic cache (`actors.ingest.reply_topics.KnownTopics`) still names it, so the 20
requests for it are admitted, as ones admitted just before a deletion are. The topic is made
after the worker's producer read the broker's topics and the producer never sends there, so it
lacks the topic's metadata: the case aiokafka's `send` waits on in line (up to its
request_timeout_ms, 40 s).

With `--exactly-once` too, where the 20 wait outside their partitions' transactions. And for
a reply topic the producer sent to before it was deleted, so still holds the metadata of: its
records would stay in the producer (`actors.emit.vanished` finds them and sends them again, to
wait apart like the others).

Two runs in one worker: the same stream of normal requests with 20 requests to a reply topic
that exists, then with 20 to the deleted one. Whether the 20 hold the others is read from the
order of the answers, not from a clock: every normal request of the second run is answered
before the first of the 20 is (they wait out a bound of `WAIT_S`, longer than the whole
stream). The latencies of both runs (a result's timestamp less its request's, both stamped on
this host) are printed as figures: docs/performance.md records them.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.structs import ConsumerRecord

from messages.error_codes import ErrorCode
from messages.request import GenerateRequest
from ops.services.topics import create_topics
from tests.integration.pipeline import (
    Lane,
    WorkerProcess,
    decode_results,
    new_lane,
    read_all,
    request_codec,
    wait_committed_to_end,
)

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m"  # the echo engine reads its tokenizer and config, not its weights
WAIT_S = 15.0  # --topic-metadata-wait-ms: the bound the 20 wait, longer than the stream
STREAM = 60  # normal requests per run
PACE_S = 0.05  # between two of them: a steady stream of 20 a second
AWAY = 20  # requests for the other reply topic per run


def request(rid: str, reply_to: str | None = None) -> GenerateRequest:
    return GenerateRequest(id=rid, prompt_token_ids=[5, 7, 9], max_new_tokens=2, reply_to=reply_to)


async def run(lane: Lane, tag: str, reply_to: str) -> None:
    """`STREAM` normal requests at a steady pace, `AWAY` to `reply_to` among the first."""
    producer = AIOKafkaProducer(bootstrap_servers=lane.bootstrap, acks="all", linger_ms=0)
    await producer.start()
    try:
        acks = []
        for i in range(STREAM):
            if i == 2:
                for j in range(AWAY):
                    r = request(f"{tag}-away-{j}", reply_to)
                    acks.append(await producer.send(lane.requests, request_codec.encode(r),
                                                    key=r.id.encode()))  # fmt: skip
            r = request(f"{tag}-{i}")
            acks.append(await producer.send(lane.requests, request_codec.encode(r),
                                            key=r.id.encode()))  # fmt: skip
            await asyncio.sleep(PACE_S)  # the load's pace, not a wait for anything
        await asyncio.gather(*acks)
    finally:
        await producer.stop()


def latencies_s(
    requests: list[ConsumerRecord[bytes, bytes]], results: list[ConsumerRecord[bytes, bytes]]
) -> dict[str, float]:
    """Result timestamp less request timestamp, by request id (the first result of each)."""
    sent = {(r.key or b"").decode(): r.timestamp for r in requests}
    out: dict[str, float] = {}
    for record, result in zip(results, decode_results(results), strict=True):
        if result.id in sent and result.id not in out:
            out[result.id] = (record.timestamp - sent[result.id]) / 1000
    return out


def p(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1]


async def delete_topic(bootstrap: str, topic: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.delete_topics([topic])
        async with asyncio.timeout(60):
            # Polled: the broker offers no event for it.
            while topic in await admin.list_topics():  # noqa: ASYNC110
                await asyncio.sleep(0.2)
    finally:
        await admin.close()


@pytest.fixture
def closing() -> Iterator[list[WorkerProcess]]:
    workers: list[WorkerProcess] = []
    yield workers
    for w in workers:
        w.close()


@pytest.mark.parametrize("sent_there", [False, True], ids=["never-sent-there", "sent-there-before"])
@pytest.mark.parametrize("exactly_once", [False, True], ids=["at-least-once", "exactly-once"])
async def test_a_deleted_reply_topic_holds_only_its_own_requests(
    kafka_bootstrap: str,
    tmp_path: Path,
    closing: list[WorkerProcess],
    exactly_once: bool,
    sent_there: bool,
) -> None:
    lane = await new_lane(kafka_bootstrap, partitions=3)
    there, gone = f"{lane.group}-there.results", f"{lane.group}-gone.results"
    await create_topics(kafka_bootstrap, names={"results": there})
    args = ["--engine", "echo", "--worker-id", "w1",
            "--topic-metadata-wait-ms", str(int(WAIT_S * 1000))]  # fmt: skip
    if exactly_once:  # the 20 wait outside their partitions' transactions
        args.append("--exactly-once")
    worker = WorkerProcess(lane, MODEL, tmp_path / "w1.log", args).start()
    closing.append(worker)
    await worker.wait_for_log("partitions_assigned")
    # Made after the worker's producer read the broker's topics: it never learns of this one.
    await create_topics(kafka_bootstrap, names={"results": gone})

    # The run without a slow destination; its requests to `there` fill the worker's cache of
    # reply topics (both `there` and `gone` are on the broker then). Sent to `gone` instead,
    # they give the worker's producer its metadata too.
    before = gone if sent_there else there
    await run(lane, "a", before)
    await read_all(lane.bootstrap, before, until=AWAY)
    await read_all(lane.bootstrap, lane.results, until=STREAM)

    await delete_topic(kafka_bootstrap, gone)
    await run(lane, "b", gone)
    expected = 2 * STREAM + AWAY  # the normal ones of both runs, and the refused ones
    results = await read_all(lane.bootstrap, lane.results, until=expected)
    requests = await read_all(lane.bootstrap, lane.requests, until=2 * (STREAM + AWAY))
    await wait_committed_to_end(lane, within_s=60)

    latency = latencies_s(requests, results)
    answers = {r.id: r for r in decode_results(results)}
    normal_a = [latency[f"a-{i}"] for i in range(STREAM)]
    normal_b = [latency[f"b-{i}"] for i in range(STREAM)]  # every one answered: none lost
    refused = [answers[f"b-away-{j}"] for j in range(AWAY)]
    away_b = [latency[f"b-away-{j}"] for j in range(AWAY)]
    figures = {
        "p50 without": statistics.median(normal_a), "p50 with": statistics.median(normal_b),
        "p90 without": p(normal_a, 90), "p90 with": p(normal_b, 90),
        "max with": max(normal_b), "gone answered after": (min(away_b), max(away_b)),
    }  # fmt: skip
    print(f"slow destination latencies (s): {figures}")

    assert all(r.error is not None and r.error.code == ErrorCode.REPLY_TO_REFUSED for r in refused)
    assert all(gone in (r.error.message if r.error else "") for r in refused)
    # The 20 held none of the others: each normal request of the run was answered before the
    # first of the 20 (which waited out its bound), by the worker's own clock (the results'
    # timestamps: the partitions of the results topic have no order between them).
    stamped = {
        r.id: record.timestamp for record, r in zip(results, decode_results(results), strict=True)
    }
    first_refused = min(stamped[f"b-away-{j}"] for j in range(AWAY))
    assert all(stamped[f"b-{i}"] < first_refused for i in range(STREAM)), figures
    letters = await read_all(lane.bootstrap, lane.dlq, until=AWAY)
    assert len(letters) >= AWAY, "each refused request to the dead-letter topic"
    assert "topic_awaited" in worker.log()
    assert ("topic_vanished" in worker.log()) is sent_there
    with contextlib.suppress(Exception):
        worker.terminate()
