"""Helpers for tests that drive the worker through a real broker.

Each test gets its own topics and consumer group (`Lane`), so tests never see each other's
records. Workers run in-process (`running_worker`) or as real subprocesses (`WorkerProcess`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import msgspec
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.structs import ConsumerRecord, OffsetAndMetadata, TopicPartition

from actors.config import WorkerConfig
from actors.kafka.connection import KafkaConnection
from messages.codec import Codec, normalize_content_type
from messages.headers import CHUNK_SCHEMA, CONTENT_TYPE, SCHEMA, header
from messages.request import GenerateRequest
from messages.result import GenerateResult
from ops.services.topics import create_topics

REPO = Path(__file__).resolve().parents[2]
request_codec = Codec(GenerateRequest)
result_codec = Codec(GenerateResult)


@dataclass(frozen=True)
class Lane:
    """One test's private topics and consumer group on the shared broker."""

    bootstrap: str
    requests: str
    results: str
    dlq: str
    group: str
    partitions: int

    def worker_config(self, **overrides: Any) -> WorkerConfig:
        base = WorkerConfig(
            kafka=KafkaConnection(self.bootstrap),
            group=self.group,
            requests_topic=self.requests,
            results_topic=self.results,
            dlq_topic=self.dlq,
            max_wait_ms=5,
            commit_interval_s=0.2,
            shutdown_timeout_s=30,
        )
        return replace(base, **overrides)

    def worker_args(self) -> list[str]:
        return [
            "--bootstrap-servers", self.bootstrap,
            "--group", self.group,
            "--requests-topic", self.requests,
            "--results-topic", self.results,
            "--dlq-topic", self.dlq,
            "--commit-interval", "0.2",
            "--http-port", "-1",  # tests that need HTTP or the control plane turn them on
            "--control-topic", "",
            "--cancel-topic", "",  # tests of cancellation turn it on
        ]  # fmt: skip


async def new_lane(bootstrap: str, partitions: int = 3) -> Lane:
    tag = uuid.uuid4().hex[:8]
    lane = Lane(
        bootstrap=bootstrap,
        requests=f"t{tag}.requests",
        results=f"t{tag}.results",
        dlq=f"t{tag}.dlq",
        group=f"g{tag}",
        partitions=partitions,
    )
    await create_topics(
        bootstrap,
        requests_partitions=partitions,
        names={"requests": lane.requests, "results": lane.results, "dlq": lane.dlq},
    )
    return lane


async def produce(
    bootstrap: str,
    topic: str,
    values: Iterable[bytes | GenerateRequest | None],
    *,
    headers: Sequence[tuple[str, bytes]] = (),
    keys: Iterable[bytes | None] | None = None,
) -> None:
    """Produce records in order (a request is encoded as JSON and keyed by its id)."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", max_request_size=20 << 20, linger_ms=5
    )
    await producer.start()
    try:
        key_iter = iter(keys) if keys is not None else None
        futures = []
        for value in values:
            key = next(key_iter) if key_iter is not None else None
            if isinstance(value, GenerateRequest):
                key, value = value.id.encode(), request_codec.encode(value)
            futures.append(
                await producer.send(topic, value=value, key=key, headers=list(headers) or None)
            )
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def read_all(
    bootstrap: str, topic: str, *, until: int, within_s: float = 120.0
) -> list[ConsumerRecord[bytes, bytes]]:
    """Every record on `topic` from the beginning, once there are at least `until` of them."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    records: list[ConsumerRecord[bytes, bytes]] = []
    try:
        deadline = time.monotonic() + within_s
        while len(records) < until and time.monotonic() < deadline:
            fetched = await consumer.getmany(timeout_ms=500)
            for batch in fetched.values():
                records.extend(batch)
    finally:
        await consumer.stop()
    return records


def decode_results(records: Iterable[ConsumerRecord[bytes, bytes]]) -> list[GenerateResult]:
    """The results among `records`; streamed requests' chunks are skipped (by their schema)."""
    return [
        result_codec.decode(r.value or b"", normalize_content_type(header(r.headers, CONTENT_TYPE)))
        for r in records
        if header(r.headers, SCHEMA) != CHUNK_SCHEMA.encode()
    ]


async def results_by_id(
    lane: Lane, ids: Iterable[str], *, within_s: float = 120.0
) -> dict[str, list[GenerateResult]]:
    """Every result on the lane's results topic, grouped by id, once all `ids` have one."""
    wanted = set(ids)
    consumer = AIOKafkaConsumer(
        lane.results,
        bootstrap_servers=lane.bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    found: dict[str, list[GenerateResult]] = defaultdict(list)
    try:
        deadline = time.monotonic() + within_s
        while not wanted <= found.keys() and time.monotonic() < deadline:
            fetched = await consumer.getmany(timeout_ms=500)
            for result in decode_results(r for batch in fetched.values() for r in batch):
                found[result.id].append(result)
    finally:
        await consumer.stop()
    return dict(found)


async def commits(lane: Lane) -> dict[int, OffsetAndMetadata]:
    """The group's last commit (offset and metadata) per requests partition."""
    admin = AIOKafkaAdminClient(bootstrap_servers=lane.bootstrap)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(lane.group)
    finally:
        await admin.close()
    return {tp.partition: meta for tp, meta in offsets.items() if tp.topic == lane.requests}


async def committed(lane: Lane) -> dict[int, int]:
    """The group's committed offset per requests partition (-1: none)."""
    return {partition: meta.offset for partition, meta in (await commits(lane)).items()}


async def every_result(
    lane: Lane, isolation: str = "read_uncommitted"
) -> dict[str, list[GenerateResult]]:
    """The whole results topic as it is now (to its end: the last stable offset when
    `isolation` is read_committed), by request id."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=lane.bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        isolation_level=isolation,
    )
    await consumer.start()
    found: dict[str, list[GenerateResult]] = defaultdict(list)
    try:
        # The results topic has as many partitions as the requests topic (create_topics).
        tps = [TopicPartition(lane.results, p) for p in range(lane.partitions)]
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        await consumer.seek_to_beginning(*tps)
        while [tp for tp, end in ends.items() if await consumer.position(tp) < end]:
            fetched = await consumer.getmany(timeout_ms=500)
            for result in decode_results(r for batch in fetched.values() for r in batch):
                found[result.id].append(result)
    finally:
        await consumer.stop()
    return dict(found)


async def end_offsets(lane: Lane) -> dict[int, int]:
    consumer = AIOKafkaConsumer(bootstrap_servers=lane.bootstrap)
    await consumer.start()
    try:
        tps = [TopicPartition(lane.requests, p) for p in range(lane.partitions)]
        ends = await consumer.end_offsets(tps)
    finally:
        await consumer.stop()
    return {tp.partition: offset for tp, offset in ends.items()}


async def wait_committed_to_end(lane: Lane, within_s: float = 30.0) -> dict[int, int]:
    ends = await end_offsets(lane)
    deadline = time.monotonic() + within_s
    while True:
        done = await committed(lane)
        if all(done.get(p, -1) == end for p, end in ends.items() if end > 0):
            return done
        if time.monotonic() > deadline:
            raise AssertionError(f"commits stuck at {done}; the partitions end at {ends}")
        await asyncio.sleep(0.3)


@contextlib.asynccontextmanager
async def running_worker(config: WorkerConfig, engine: Any) -> AsyncIterator[Any]:
    """An in-process worker on `engine`; drained and awaited on exit."""
    from actors.ingest.model_front import ModelFront
    from actors.worker import Worker

    worker = Worker(config, engine, ModelFront.of_engine(engine))
    task = asyncio.create_task(worker.run())
    await worker.started.wait()
    try:
        yield worker
    finally:
        worker.drain()
        await asyncio.wait_for(task, 60)


STARTED: list[WorkerProcess] = []  # every worker this test process started: failures show logs


@dataclass
class WorkerProcess:
    """`tokenmill worker` as a real subprocess, its log in a file (shown with a test that
    fails: tests/integration/conftest.py)."""

    lane: Lane
    model: str
    log_path: Path
    extra: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)  # on top of this process's
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> WorkerProcess:
        argv = [
            sys.executable, "-m", "ops", "worker", "--model", self.model,
            *self.lane.worker_args(), *self.extra,
        ]  # fmt: skip
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        self._log = self.log_path.open("ab")
        self.process = subprocess.Popen(argv, cwd=REPO, env=env, stdout=self._log, stderr=self._log)
        STARTED.append(self)
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> int:
        return self._signal(signal.SIGKILL)

    def terminate(self) -> int:
        return self._signal(signal.SIGTERM)

    def _signal(self, sig: signal.Signals) -> int:
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(timeout=90)
        except subprocess.TimeoutExpired:
            # Hung: killed, so that no process outlives its test (its log follows the failure)
            self.process.kill()
            self.process.wait()
            raise AssertionError(
                f"worker {self.pid} ({self.log_path.name}) did not exit within 90 s of {sig.name}"
            ) from None
        finally:
            self._log.close()

    def wait(self, timeout: float) -> int:
        """Wait for the worker to exit on its own; its exit code."""
        assert self.process is not None
        try:
            return self.process.wait(timeout=timeout)
        finally:
            self._log.close()

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.kill()

    async def wait_for_log(self, needle: str | tuple[str, ...], within_s: float = 120.0) -> None:
        """Until the log holds `needle` (or, given several, any one of them)."""
        needles = (needle,) if isinstance(needle, str) else needle
        deadline = time.monotonic() + within_s
        while not any(n in self.log() for n in needles):
            if self.process is not None and self.process.poll() is not None:
                raise AssertionError(f"worker exited early:\n{self.log()[-3000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {needle!r} in the worker log:\n{self.log()[-3000:]}")
            await asyncio.sleep(0.2)


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def encode_json(obj: Any) -> bytes:
    return msgspec.json.encode(obj)
