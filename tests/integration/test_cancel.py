"""Cancellation through real workers on the session broker, on SmolLM2.

A cancel record on the lane's cancel topic stops its request wherever the worker holds it:
in a length bucket (no tokens), in the engine (the tokens made so far, a prefix of what the
request would have made). Every request gets exactly one result and ordinary requests beside
the cancelled ones come out as they would alone. A cancel read by a worker that does not hold
the request changes nothing there.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest

from actors.ingest.model_front import ModelFront
from actors.telemetry.metrics import WorkerMetrics
from actors.worker import Worker
from gpu.engine import Engine, EngineRequest
from gpu.engine_config import EngineConfig
from gpu.loading.loader import load_model
from gpu.sequence import SamplingParams
from messages.cancel import CancelRequest, cancel_codec
from messages.request import GenerateRequest
from messages.result import FinishReason, GenerateResult
from ops.batch.cancel import cancel_marker
from ops.cancel.client import CancelSender
from ops.services.topics import create_topics
from tests.integration.pipeline import (
    REPO,
    Lane,
    WorkerProcess,
    decode_results,
    new_lane,
    produce,
    read_all,
    results_by_id,
    wait_committed_to_end,
)
from tests.integration.test_batch import (
    MODEL,
    batch_argv,
    completion,
    output_lines,
    start,
    write_jsonl,
)

COUNTING = "1, 2, 3, 4, 5, 6, 7, 8,"  # SmolLM2 counts on for a long while: no early EOS


@pytest.fixture(scope="module")
def smollm2(smollm2_path: Path) -> Any:
    return load_model(smollm2_path, name="smollm2-135m")


async def cancel_lane(bootstrap: str, partitions: int = 2) -> tuple[Lane, str]:
    lane = await new_lane(bootstrap, partitions=partitions)
    topic = f"{lane.requests.removesuffix('.requests')}.cancel"
    await create_topics(bootstrap, names={"cancel": topic})
    return lane, topic


@dataclass
class Running:
    worker: Worker
    metrics: WorkerMetrics

    def cancels(self, found: str) -> float:
        return float(self.metrics.cancels.labels(found)._value.get())


@contextlib.asynccontextmanager
async def running(
    lane: Lane, cancel_topic: str, model: Any, **overrides: Any
) -> AsyncIterator[Running]:
    """An in-process worker with metrics, its cancel reader ready."""
    engine = Engine(model, EngineConfig())
    metrics = WorkerMetrics()
    config = lane.worker_config(cancel_topic=cancel_topic, **overrides)
    worker = Worker(config, engine, ModelFront.of_engine(engine), metrics=metrics)
    task = asyncio.create_task(worker.run())
    try:
        assert worker.cancel is not None
        await asyncio.wait_for(worker.cancel.ready.wait(), 60)
        yield Running(worker, metrics)
    finally:
        worker.drain()
        await asyncio.wait_for(task, 120)


async def until(condition: Callable[[], bool], what: str, within_s: float = 60.0) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"never came true: {what}")
        await asyncio.sleep(0.02)


def reference(model: Any, request: GenerateRequest) -> list[int]:
    """What `request` makes alone, on an engine of its own."""
    engine = Engine(model, EngineConfig())
    prompt = ModelFront.of_engine(engine).prompt_tokens(request)
    params = SamplingParams(max_new_tokens=request.max_new_tokens)
    engine.add(EngineRequest(request.id, prompt, params))
    while engine.has_work():
        for done in engine.step().finished:
            return done.token_ids
    raise AssertionError("the engine finished nothing")


def decoding(worker: Worker, request_id: str, tokens: int) -> bool:
    entry = worker.gpu.in_flight.get(request_id)
    seq = entry.engine.sequences.get(request_id) if entry is not None else None  # type: ignore[attr-defined]
    return seq is not None and len(seq.output_token_ids) >= tokens


async def send_cancel(lane: Lane, topic: str, *ids: str) -> None:
    async with CancelSender(lane.bootstrap, topic) as sender:
        await sender.cancel(ids, reason="test")


def once(found: dict[str, list[GenerateResult]]) -> dict[str, GenerateResult]:
    assert all(len(results) == 1 for results in found.values()), {
        k: len(v) for k, v in found.items() if len(v) != 1
    }
    return {k: v[0] for k, v in found.items()}


async def test_a_cancel_stops_a_request_in_a_bucket_and_one_decoding(
    kafka_bootstrap: str, smollm2: Any
) -> None:
    lane, topic = await cancel_lane(kafka_bootstrap)
    tag = uuid.uuid4().hex[:6]
    long = GenerateRequest(id=f"long-{tag}", prompt=COUNTING, max_new_tokens=1000)
    held = GenerateRequest(id=f"held-{tag}", prompt=COUNTING, max_new_tokens=40)
    # A bucket waits 10 minutes: what arrives while `long` runs stays there until cancelled.
    async with running(lane, topic, smollm2, max_wait_ms=600_000) as run:
        worker = run.worker
        await produce(lane.bootstrap, lane.requests, [long])
        await until(lambda: decoding(worker, long.id, 2), "the long request decodes")
        await produce(lane.bootstrap, lane.requests, [held])
        await until(lambda: len(worker.ingest.buckets) == 1, "the second request is bucketed")
        cli = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "ops", "cancel", held.id, "--topic", topic,
             "--bootstrap-servers", lane.bootstrap],
            cwd=REPO, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert cli.returncode == 0 and "sent 1 cancel record" in cli.stdout, cli.stderr
        await until(lambda: run.cancels("bucket") == 1, "the bucketed one is cancelled")
        await send_cancel(lane, topic, long.id)
        found = once(await results_by_id(lane, [long.id, held.id]))
        await wait_committed_to_end(lane)
        # Finished ids: a cancel changes nothing, and answers nothing again.
        await send_cancel(lane, topic, long.id, held.id, f"unknown-{tag}")
        await until(lambda: run.cancels("none") == 3, "the late cancels are no-ops")
        # A cancel ahead of its request: the request is answered cancelled when it arrives.
        early = GenerateRequest(id=f"early-{tag}", prompt=COUNTING, max_new_tokens=40)
        await send_cancel(lane, topic, early.id)
        await until(lambda: run.cancels("none") == 4, "the early cancel is read")
        await produce(lane.bootstrap, lane.requests, [early])
        arrived = once(await results_by_id(lane, [early.id]))[early.id]
        await wait_committed_to_end(lane)

    bucketed, stopped = found[held.id], found[long.id]
    assert bucketed.finish_reason is FinishReason.CANCELLED and bucketed.error is None
    assert bucketed.token_ids == [] and bucketed.usage.completion_tokens == 0
    assert stopped.finish_reason is FinishReason.CANCELLED and stopped.error is None
    assert 2 <= len(stopped.token_ids) < long.max_new_tokens
    made = msgspec.structs.replace(long, max_new_tokens=len(stopped.token_ids))
    assert stopped.token_ids == reference(smollm2, made), "what it made is what it would have"
    assert stopped.usage.completion_tokens == len(stopped.token_ids)
    assert (run.cancels("engine"), run.cancels("bucket")) == (1, 1)
    assert arrived.finish_reason is FinishReason.CANCELLED and arrived.token_ids == []
    assert run.cancels("arrival") == 1
    everything = decode_results(await read_all(lane.bootstrap, lane.results, until=3))
    assert sorted(r.id for r in everything) == sorted([long.id, held.id, early.id]), "once each"


async def test_cancels_among_ordinary_requests_on_two_workers(
    kafka_bootstrap: str, smollm2: Any
) -> None:
    """Two workers share the requests; each reads every cancel, only the holder acts on it."""
    lane, topic = await cancel_lane(kafka_bootstrap, partitions=2)
    tag = uuid.uuid4().hex[:6]
    ordinary = [
        GenerateRequest(id=f"ok-{tag}-{i}", prompt=f"{i} + {i} =", max_new_tokens=6)
        for i in range(6)
    ]
    doomed = [
        GenerateRequest(id=f"doomed-{tag}-{i}", prompt=COUNTING, max_new_tokens=1000)
        for i in range(4)
    ]
    expected = {r.id: reference(smollm2, r) for r in ordinary}
    mixed = [r for pair in zip(ordinary, doomed, strict=False) for r in pair] + ordinary[4:]
    async with (
        running(lane, topic, smollm2, worker_id=f"first-{tag}") as first,
        running(lane, topic, smollm2, worker_id=f"second-{tag}") as second,
    ):
        workers = (first, second)
        await until(
            lambda: (
                all(w.worker.ingest.joined for w in workers)
                and sum(requests_partitions(w.worker.ingest.consumer) for w in workers) == 2
            ),  # type: ignore[union-attr]
            "both workers hold a partition",
        )
        await produce(lane.bootstrap, lane.requests, mixed)
        # Read by the workers first: a cancel for a request still on the topic is a no-op.
        await until(
            lambda: sum(w.worker.ingest.records_read for w in workers) == len(mixed),
            "every request is read",
        )
        await send_cancel(lane, topic, *(r.id for r in doomed))
        found = once(await results_by_id(lane, [r.id for r in mixed]))
        await wait_committed_to_end(lane)
        await until(
            lambda: all(w.worker.cancel.received == len(doomed) for w in workers),  # type: ignore[union-attr]
            "every worker read every cancel",
        )

    for request in ordinary:
        result = found[request.id]
        assert result.error is None and result.token_ids == expected[request.id], request.id
    for request in doomed:
        result = found[request.id]
        assert result.finish_reason is FinishReason.CANCELLED, (request.id, result.finish_reason)
        assert len(result.token_ids) < request.max_new_tokens
    acted = sum(w.cancels(f) for w in workers for f in ("bucket", "queue", "engine"))
    ignored = sum(w.cancels("none") for w in workers)
    assert (acted, ignored) == (len(doomed), len(doomed))
    everything = decode_results(await read_all(lane.bootstrap, lane.results, until=len(mixed)))
    assert len(everything) == len(mixed), "every request answered exactly once"


async def test_a_cancel_sent_before_the_worker_started_still_holds(
    kafka_bootstrap: str, smollm2: Any
) -> None:
    """The cancel reader starts at the cancels of the last 10 minutes: a worker started after
    a cancel answers its request cancelled when it arrives, and runs the others."""
    lane, topic = await cancel_lane(kafka_bootstrap)
    tag = uuid.uuid4().hex[:6]
    doomed = GenerateRequest(id=f"before-{tag}", prompt=COUNTING, max_new_tokens=40)
    spared = GenerateRequest(id=f"spared-{tag}", prompt="1 + 1 =", max_new_tokens=4)
    await send_cancel(lane, topic, doomed.id)
    async with running(lane, topic, smollm2) as run:
        await until(lambda: run.cancels("none") == 1, "the earlier cancel is read at start")
        await produce(lane.bootstrap, lane.requests, [doomed, spared])
        found = once(await results_by_id(lane, [doomed.id, spared.id]))
        await wait_committed_to_end(lane)
    assert found[doomed.id].finish_reason is FinishReason.CANCELLED
    assert found[doomed.id].token_ids == [] and run.cancels("arrival") == 1
    assert found[spared.id].token_ids == reference(smollm2, spared)


async def test_a_worker_started_before_its_cancel_topic_reads_cancels_once_it_exists(
    kafka_bootstrap: str, smollm2: Any
) -> None:
    """A missing cancel topic is looked for again (not subscribed to, which would ask the broker
    for it ten times a second); once it is made, the reader is ready and cancels hold."""
    lane = await new_lane(kafka_bootstrap, partitions=2)
    topic = f"{lane.requests.removesuffix('.requests')}.cancel"
    engine = Engine(smollm2, EngineConfig())
    metrics = WorkerMetrics()
    config = lane.worker_config(cancel_topic=topic)
    worker = Worker(config, engine, ModelFront.of_engine(engine), metrics=metrics)
    assert worker.cancel is not None
    worker.cancel.topic_recheck_s = 0.2
    looked = 0
    original = worker.cancel._topic_found

    async def counted(consumer: Any) -> bool:
        nonlocal looked
        looked += 1
        return await original(consumer)

    worker.cancel._topic_found = counted  # type: ignore[method-assign]
    task = asyncio.create_task(worker.run())
    try:
        await until(lambda: looked == 1, "the reader looks for its topic")
        assert not worker.cancel.ready.is_set()
        await create_topics(kafka_bootstrap, names={"cancel": topic})
        await asyncio.wait_for(worker.cancel.ready.wait(), 60)
        doomed = GenerateRequest(id=f"late-topic-{uuid.uuid4().hex[:6]}", prompt=COUNTING)
        await send_cancel(lane, topic, doomed.id)
        await until(lambda: float(metrics.cancels.labels("none")._value.get()) == 1, "read")
        await produce(lane.bootstrap, lane.requests, [doomed])
        found = once(await results_by_id(lane, [doomed.id]))
    finally:
        worker.drain()
        await asyncio.wait_for(task, 120)
    assert found[doomed.id].finish_reason is FinishReason.CANCELLED


def test_a_cancel_record_encodes_as_documented() -> None:
    cancel = CancelRequest(id="job-17")
    assert cancel_codec.encode(cancel) == b'{"v":1,"id":"job-17","reason":""}'


async def test_batch_cancel_stops_a_run_and_a_rerun_finishes_it(
    kafka_bootstrap: str, smollm2_path: Path, tmp_path: Path
) -> None:
    """`tokenmill batch cancel` against a real `batch run` and worker, as subprocesses."""
    lane, topic = await cancel_lane(kafka_bootstrap)
    short = [completion(f"short-{i}", f"{i} + {i} =", max_tokens=2) for i in range(2)]
    # long enough to be running still when the cancel lands (it starts a process first)
    long = [completion(f"long-{i}", COUNTING, max_tokens=400) for i in range(6)]
    source = write_jsonl(tmp_path / "in.jsonl", [*short, *long])
    out = tmp_path / "out.jsonl"
    run_argv = [*batch_argv(lane, "run", str(source), "-o", str(out), "--max-inflight", "4",
                            "--json"), "--cancel-topic", topic, "--cancel-wait", "30"]  # fmt: skip
    process = WorkerProcess(lane, MODEL, tmp_path / "worker.log", extra=["--cancel-topic", topic])
    process.start()
    try:
        await process.wait_for_log("cancel_ready")
        running = start(run_argv)
        deadline = time.monotonic() + 120
        while not (out.exists() and len(out.read_text().splitlines()) >= 2):  # the short two
            assert running.poll() is None and time.monotonic() < deadline, "no short answers"
            await asyncio.sleep(0.1)
        asked = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "ops", "batch", "cancel", str(out)],
            cwd=REPO, capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        assert asked.returncode == 0, asked.stderr[-2000:]
        stdout, stderr = await asyncio.to_thread(running.communicate, timeout=300)
        assert running.returncode == 1, stderr.decode()[-2000:]  # stopped before the end
        summary = json.loads(stdout)
        assert summary["cancel_requested"] and not summary["complete"]
        cancelled = [line for line in output_lines(out) if finish(line) == "cancelled"]
        assert len(cancelled) == summary["cancelled"] >= 1
        assert all(line["custom_id"].startswith("long-") for line in cancelled)
        assert not cancel_marker(out).exists()

        nothing = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "ops", "batch", "cancel", str(out)],
            cwd=REPO, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert nothing.returncode == 1 and "no `tokenmill batch run`" in nothing.stderr

        # The two long lines left take 400 tokens each: on a busy machine that is more than
        # the lane's 120 s without an answer, so this run waits as long as the test may.
        rerun = await asyncio.to_thread(
            subprocess.run, [*run_argv, "--stall-timeout", "1500"],
            cwd=REPO, capture_output=True, text=True, timeout=1800,
        )  # fmt: skip
        assert rerun.returncode == 0, rerun.stderr[-2000:]
        assert process.terminate() == 0
    finally:
        process.close()
    lines = output_lines(out)
    ids = [line["custom_id"] for line in lines]
    assert sorted(ids) == sorted(line["custom_id"] for line in [*short, *long]), "each once"
    by_id = {line["custom_id"]: line for line in lines}
    assert all(finish(by_id[line["custom_id"]]) == "length" for line in short)
    assert sum(finish(by_id[line["custom_id"]]) == "cancelled" for line in long) == len(cancelled)


def finish(line: dict[str, Any]) -> str:
    """tokenmill's finish reason (`cancelled` has a field of its own: OpenAI's has none)."""
    choice = line["response"]["body"]["choices"][0]
    return str(choice.get("tokenmill", {}).get("finish_reason", choice["finish_reason"]))


def requests_partitions(consumer: Any) -> int:
    """The requests topic's partitions a consumer holds (its retry topics' are assigned too)."""
    return sum(".retry." not in tp.topic for tp in consumer.assignment())
