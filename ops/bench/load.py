"""The load client every Kafka benchmark drives a worker with: it produces requests (all at once,
or open loop at a rate) and stamps each result as it is fetched. `worker` starts a warmed-up
`tokenmill worker` with a client of its own; `flood` (all at once: requests/s, tokens/s) and
`latency` (at a light rate: end to end, and its legs) measure it."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition

from actors.kafka.connection import KafkaConnection
from messages.codec import Codec
from messages.request import GenerateRequest
from messages.result import GenerateResult
from ops.bench.report import percentiles
from ops.bench.rig import ROLES, CpuMeter, Rig, log_tail, worker_argv, worker_process
from ops.models.engine_options import EngineChoice

_requests = Codec(GenerateRequest)
_results = Codec(GenerateResult)


@dataclass(frozen=True)
class Stamp:
    mono: float  # perf_counter seconds, for durations
    unix: float  # for windows, against the worker's events

    @staticmethod
    def now() -> Stamp:
        return Stamp(time.perf_counter(), time.time())


@dataclass(frozen=True)
class Arrival:
    at: Stamp  # fetched here
    result: GenerateResult
    result_leg_ms: float  # from the result record's timestamp (the worker's send) to its fetch


class LoadClient:
    """An idempotent producer of requests, and a task that reads the results topic from its end
    as it was on entry, keeping each id's first result and counting duplicates."""

    def __init__(
        self, kafka: KafkaConnection, topics: dict[str, str], *, linger_ms: int = 0
    ) -> None:
        self.topics = topics
        self.producer = AIOKafkaProducer(
            **kafka.producer_kwargs(), acks="all", enable_idempotence=True, linger_ms=linger_ms,
            max_batch_size=256 << 10,
        )  # fmt: skip
        self.consumer = AIOKafkaConsumer(
            **kafka.client_kwargs(), enable_auto_commit=False, isolation_level="read_committed"
        )
        self.arrived: dict[str, Arrival] = {}
        self.duplicates: Counter[str] = Counter()
        self._fetched = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> LoadClient:
        await self.producer.start()
        await self.consumer.start()
        partitions = await self.producer.partitions_for(self.topics["results"])
        tps = [TopicPartition(self.topics["results"], p) for p in sorted(partitions)]
        self.consumer.assign(tps)
        await self.consumer.seek_to_end(*tps)
        for tp in tps:  # resolve positions now, not lazily after results arrive
            await self.consumer.position(tp)
        self._task = asyncio.create_task(self._collect())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.consumer.stop()
        await self.producer.stop()

    async def _collect(self) -> None:
        while True:
            fetched = await self.consumer.getmany(timeout_ms=100, max_records=10_000)
            at = Stamp.now()
            for records in fetched.values():
                for record in records:
                    self._take(record, at)
            if fetched:
                self._fetched.set()

    def _take(self, record: Any, at: Stamp) -> None:
        """One fetched record: its result arrived (again: a duplicate)."""
        result = _results.decode(record.value or b"")
        if result.id in self.arrived:
            self.duplicates[result.id] += 1
        else:
            self.arrived[result.id] = Arrival(at, result, at.unix * 1e3 - record.timestamp)

    async def send(self, request: GenerateRequest | tuple[str, bytes]) -> asyncio.Future[Any]:
        """Queue one request (or an id and its encoded bytes); the future of its ack."""
        rid, value = (
            request if isinstance(request, tuple) else (request.id, _requests.encode(request))
        )
        topic = self.topics["requests"]
        ack: asyncio.Future[Any] = await self.producer.send(topic, value=value, key=rid.encode())
        return ack

    async def send_all(self, requests: Sequence[GenerateRequest]) -> float:
        """Every request as fast as the producer takes them (encoded first); returns when the
        first went out (perf_counter), after every ack."""
        values = [(r.id, _requests.encode(r)) for r in requests]
        start = time.perf_counter()
        await asyncio.gather(*[await self.send(v) for v in values])
        return start

    async def at_rate(
        self, make: Callable[[int], GenerateRequest], rate: float, count: int,
        more: Callable[[dict[str, Stamp]], bool] = lambda _: False,
    ) -> tuple[dict[str, Stamp], list[float]]:  # fmt: skip
        """Open loop: request `i` (`make(i)`) at start + i / rate, never waiting for answers,
        `count` of them and on while `more(sent)`. Each send's stamp, and how late each went."""
        sent: dict[str, Stamp] = {}
        late: list[float] = []
        acks, start, i = [], time.perf_counter(), 0
        while i < count or more(sent):
            request = make(i)
            due = start + i / rate
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            sent[request.id] = stamp = Stamp.now()
            late.append((stamp.mono - due) * 1e3)
            acks.append(await self.send(request))
            i += 1
        await asyncio.gather(*acks)
        return sent, late

    async def missing(self, ids: Collection[str], within_s: float) -> set[str]:
        """The ids still unanswered once all are in, or after `within_s` seconds."""
        left = set(ids) - self.arrived.keys()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within_s):
                while left:
                    self._fetched.clear()
                    await self._fetched.wait()
                    left -= self.arrived.keys()
        return left


@dataclass
class Worker:
    """A `tokenmill worker` subprocess on topics of its own, and the load client feeding it."""

    proc: asyncio.subprocess.Process
    client: LoadClient
    log: Path
    argv: list[str]  # its flags, for the report
    topics: dict[str, str]
    warm_up_s: float | None = None  # first send → all warm-up results in
    exit_code: int | None = None


@contextlib.asynccontextmanager
async def worker(
    r: Rig, name: str, choice: EngineChoice, kind: str, warm: Sequence[GenerateRequest],
    timeout_s: float, *, roles: tuple[str, ...] = ROLES, env: dict[str, str] | None = None,
    linger_ms: int = 0, **flags: object,
) -> AsyncIterator[Worker]:  # fmt: skip
    """Start a `kind` worker of `choice` (its CLI flags, and `flags`) on fresh topics, wait for
    the answers to `warm` (model load, group join, first steps), yield it; drained on the way
    out. RuntimeError with the worker's log if it exits or stalls before answering."""
    topics = await r.topics(name, roles)
    log = r.tmp / f"worker-{name}.log"
    argv, secrets = worker_argv(choice, kind, r.kafka, topics, **flags)
    async with (
        worker_process(argv, log, env=secrets | (env or {})) as proc,
        LoadClient(r.kafka, topics, linger_ms=linger_ms) as client,
    ):
        w = Worker(proc, client, log, argv[3:], topics)
        start = await client.send_all(warm)
        waiting = asyncio.ensure_future(client.missing([q.id for q in warm], timeout_s))
        exited = asyncio.ensure_future(proc.wait())
        await asyncio.wait({waiting, exited}, return_when=asyncio.FIRST_COMPLETED)
        exited.cancel()
        if not waiting.done() or waiting.result():
            waiting.cancel()
            raise RuntimeError(f"the worker did not answer its warm-up requests:\n{log_tail(log)}")
        w.warm_up_s = round(time.perf_counter() - start, 2)
        yield w
    w.exit_code = proc.returncode


async def flood(
    client: LoadClient, requests: Sequence[GenerateRequest], meter: CpuMeter, within_s: float,
    tokens: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """Every request at once: requests/s and output tokens/s from the first send to the last
    result; with `tokens`, each request's tokens (None where lost or failed) too."""
    meter.start()
    start = await client.send_all(requests)
    sent = time.perf_counter() - start
    await client.missing([r.id for r in requests], within_s)
    got = [client.arrived.get(r.id) for r in requests]
    ok = [a.result.token_ids if a and a.result.ok else None for a in got]
    wall = max((a.at.mono for a in got if a), default=start) - start
    count, cpu = sum(len(t) for t in ok if t is not None), meter.read()
    out = {
        "requests": len(requests), "results": sum(1 for a in got if a),
        "errors": sum(1 for a, t in zip(got, ok, strict=True) if a and t is None),
        "wall_s": round(wall, 3),
        "requests_per_s": round(sum(1 for t in ok if t is not None) / wall, 1) if wall else None,
        "output_tokens": count, "output_tokens_per_s": round(count / wall, 2) if wall > 0 else None,
        # When the producer finishing is near wall_s, this process's producing was the limit.
        "all_sent_and_acked_s": round(sent, 3), "cpu_s": cpu,
        # CPU seconds per wall second: near 1.0, a single-threaded process was the limit.
        "cores_busy": {k: None if v is None or not wall else round(v / wall, 2)
                       for k, v in cpu.items()},
    }  # fmt: skip
    return out | ({"results_tokens": ok} if tokens else {})


async def latency(
    client: LoadClient, requests: Sequence[GenerateRequest], rate: float, within_s: float
) -> dict[str, Any]:
    """One request every 1/rate s; end to end = just before the send → fetched here."""
    sent, _ = await client.at_rate(lambda i: requests[i], rate, len(requests))
    await client.missing(sent, within_s)
    ok = {i: client.arrived[i] for i in sent if i in client.arrived and client.arrived[i].result.ok}
    answered = sum(1 for i in sent if i in client.arrived)
    e2e = {i: (a.at.mono - sent[i].mono) * 1e3 for i, a in ok.items()}
    return {
        "requests": len(requests), "results": answered, "errors": answered - len(ok),
        "end_to_end_ms": percentiles(list(e2e.values())),
        # Its legs: the way in (produce, fetch, decode, tokenize, queue); the way back (result
        # sent → fetched here); the worker's own view (consumed → result built).
        "request_leg_ms": percentiles(
            [e2e[i] - a.result.timings.total_ms - a.result_leg_ms for i, a in ok.items()]),
        "result_leg_ms": percentiles([a.result_leg_ms for a in ok.values()]),
        "worker_total_ms": percentiles([a.result.timings.total_ms for a in ok.values()]),
        "worker_queued_ms": percentiles([a.result.timings.queued_ms for a in ok.values()]),
    }  # fmt: skip
