"""The load generator's Kafka side: producing requests, collecting results, and what they measure.

`LoadClient` produces encoded requests and stamps each result as it is fetched; the functions
below drive it for each section of `ops/bench/pipeline.py`: the warm-up of a fresh worker,
a burst of the whole workload (throughput), requests at a fixed rate (latency, split into its
legs), and floods as fast as this process produces (the ceiling). Each returns a JSON-ready dict.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition

from actors.kafka.connection import KafkaConnection
from messages.codec import Codec
from messages.request import GenerateRequest
from messages.result import GenerateResult
from ops.bench.worker import CpuMeter, log_tail
from ops.bench.workload import BenchRequest

_requests = Codec(GenerateRequest)
_results = Codec(GenerateResult)


class LoadClient:
    """Produces requests; a background task fetches results and stamps each on arrival.

    It reads the results topic from its end as it was before anything was sent.
    """

    def __init__(self, kafka: KafkaConnection, topics: dict[str, str], *, linger_ms: int) -> None:
        self.topics = topics
        self.producer = AIOKafkaProducer(
            **kafka.producer_kwargs(),
            acks="all",
            enable_idempotence=True,
            linger_ms=linger_ms,
            max_batch_size=256 << 10,
        )
        self.consumer = AIOKafkaConsumer(**kafka.client_kwargs(), enable_auto_commit=False)
        self.arrived: dict[str, tuple[float, GenerateResult]] = {}  # id → (perf_counter, result)
        # id → ms from the result record's timestamp (the worker's send) to its fetch here
        self.result_leg_ms: dict[str, float] = {}
        self._pending: set[str] = set()
        self._all_in = asyncio.Event()
        self._collector: asyncio.Task[None] | None = None

    async def __aenter__(self) -> LoadClient:
        await self.producer.start()
        await self.consumer.start()
        partitions = await self.producer.partitions_for(self.topics["results"])
        tps = [TopicPartition(self.topics["results"], p) for p in partitions]
        self.consumer.assign(tps)
        await self.consumer.seek_to_end(*tps)
        for tp in tps:  # resolve positions now, not lazily after results arrive
            await self.consumer.position(tp)
        self._collector = asyncio.create_task(self._collect())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._collector is not None:
            self._collector.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._collector
        await self.consumer.stop()
        await self.producer.stop()

    async def send(self, request_id: str, value: bytes) -> asyncio.Future[Any]:
        """Queue one encoded request; returns the future of its acknowledgement."""
        future: asyncio.Future[Any] = await self.producer.send(
            self.topics["requests"], value=value, key=request_id.encode()
        )
        return future

    async def wait(
        self, ids: Sequence[str], within_s: float
    ) -> dict[str, tuple[float, GenerateResult]]:
        """The arrivals of `ids` once all are in, or whatever came within `within_s` seconds."""
        self._pending = set(ids) - self.arrived.keys()
        self._all_in.clear()
        if self._pending:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._all_in.wait(), within_s)
        return {i: self.arrived[i] for i in ids if i in self.arrived}

    async def _collect(self) -> None:
        while True:
            fetched = await self.consumer.getmany(timeout_ms=100, max_records=10_000)
            now, wall_ms = time.perf_counter(), time.time() * 1e3
            for records in fetched.values():
                for record in records:
                    result = _results.decode(record.value or b"")
                    self.arrived[result.id] = (now, result)
                    self.result_leg_ms[result.id] = wall_ms - record.timestamp
                    self._pending.discard(result.id)
            if not self._pending:
                self._all_in.set()


async def send_all(client: LoadClient, requests: Sequence[GenerateRequest]) -> float:
    """Produce every request as fast as the producer takes them (pre-encoded); returns when the
    first was handed over (perf_counter). Waits for every acknowledgement."""
    values = [(r.id, _requests.encode(r)) for r in requests]
    start = time.perf_counter()
    acks = [await client.send(request_id, value) for request_id, value in values]
    await asyncio.gather(*acks)
    return start


def wire_requests(workload: Sequence[BenchRequest], prefix: str) -> list[GenerateRequest]:
    return [
        GenerateRequest(
            id=f"{prefix}{i}", prompt_token_ids=r.prompt_token_ids, max_new_tokens=r.max_new_tokens
        )
        for i, r in enumerate(workload)
    ]


async def warm_up(
    client: LoadClient,
    proc: asyncio.subprocess.Process,
    log: Path,
    requests: list[GenerateRequest],
    within_s: float,
) -> float:
    """Send a few requests and wait for their results (model load, group join, first steps).

    Seconds it took; raises RuntimeError with the worker's log if it exits or times out.
    """
    start = await send_all(client, requests)
    waiting = asyncio.ensure_future(client.wait([r.id for r in requests], within_s))
    exited = asyncio.ensure_future(proc.wait())
    await asyncio.wait({waiting, exited}, return_when=asyncio.FIRST_COMPLETED)
    exited.cancel()
    if not waiting.done() or len(waiting.result()) < len(requests):
        waiting.cancel()
        raise RuntimeError(f"the worker did not answer its warm-up requests:\n{log_tail(log)}")
    return round(time.perf_counter() - start, 2)


def percentiles(values: Sequence[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p90": None, "p99": None}
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return {"p50": round(float(p50), 2), "p90": round(float(p90), 2), "p99": round(float(p99), 2)}


async def kafka_throughput(
    client: LoadClient,
    workload: Sequence[BenchRequest],
    prefix: str,
    meter: CpuMeter,
    within_s: float,
) -> dict[str, Any]:
    """The workload sent at once: output tokens/s from the first send to the last result.
    `results_tokens` holds each request's tokens (None where lost or failed), to compare."""
    requests = wire_requests(workload, prefix)
    meter.start()
    start = await send_all(client, requests)
    arrived = await client.wait([r.id for r in requests], within_s)
    wall = max((t for t, _ in arrived.values()), default=start) - start
    results = [arrived[r.id][1] if r.id in arrived else None for r in requests]
    tokens = sum(len(r.token_ids) for r in results if r is not None and r.ok)
    return {
        "requests": len(requests),
        "results": len(arrived),
        "errors": sum(1 for r in results if r is not None and not r.ok),
        "output_tokens": tokens,
        "wall_s": round(wall, 3),
        "output_tokens_per_s": round(tokens / wall, 2) if wall > 0 else None,
        "cpu_s": meter.read(),
        "results_tokens": [r.token_ids if r is not None and r.ok else None for r in results],
    }


async def kafka_latency(
    client: LoadClient, short: Sequence[BenchRequest], rate: float, within_s: float
) -> dict[str, Any]:
    """One request every 1/rate s; end to end = just before send → fetched by this client."""
    requests = wire_requests(short, "latency-")
    sent_at: dict[str, float] = {}
    acks = []
    start = time.perf_counter()
    for i, request in enumerate(requests):
        await asyncio.sleep(max(0.0, start + i / rate - time.perf_counter()))
        sent_at[request.id] = time.perf_counter()
        acks.append(await client.send(request.id, _requests.encode(request)))
    await asyncio.gather(*acks)
    arrived = await client.wait(list(sent_at), within_s)
    ok = {i: res for i, (_, res) in arrived.items() if res.ok}
    e2e = {i: (arrived[i][0] - sent_at[i]) * 1e3 for i in ok}
    back = {i: client.result_leg_ms[i] for i in ok}
    return {
        "requests": len(requests),
        "results": len(arrived),
        "errors": len(arrived) - len(ok),
        "end_to_end_ms": percentiles(list(e2e.values())),
        # Its parts, per request: the way in (produce, fetch, decode, tokenize) and the
        # emitter's queue; the worker's own time; the way back (result sent → fetched here).
        "request_leg_ms": percentiles(
            [e2e[i] - r.timings.total_ms - back[i] for i, r in ok.items()]
        ),
        "result_leg_ms": percentiles(list(back.values())),
        # The worker's own view: consumed → result built (excludes Kafka in and out).
        "worker_total_ms": percentiles([r.timings.total_ms for r in ok.values()]),
        "worker_queued_ms": percentiles([r.timings.queued_ms for r in ok.values()]),
    }


async def ceiling_run(
    client: LoadClient, requests: Sequence[GenerateRequest], meter: CpuMeter, within_s: float
) -> dict[str, Any]:
    meter.start()
    start = await send_all(client, requests)
    sent = time.perf_counter() - start
    arrived = await client.wait([r.id for r in requests], within_s)
    wall = max((t for t, _ in arrived.values()), default=start) - start
    ok = sum(1 for _, res in arrived.values() if res.ok)
    cpu = meter.read()
    return {
        "requests": len(requests),
        "results": len(arrived),
        "errors": len(arrived) - ok,
        "wall_s": round(wall, 3),
        "requests_per_s": round(ok / wall, 1) if wall > 0 else None,
        # When the producer finishing is near wall_s, this process's producing was the limit.
        "all_sent_and_acked_s": round(sent, 3),
        "cpu_s": cpu,
        # CPU seconds per wall second: near 1.0, a single-threaded process was the limit.
        "cores_busy": {
            k: round(v / wall, 2) if v is not None and wall > 0 else None for k, v in cpu.items()
        },
    }
