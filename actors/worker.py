"""A worker: the ingest, GPU and emitter actors wired together in one `TaskGroup`.

    ingest ──Batch──► gpu ──Outcome──► emitter ──Delivered──► ingest

`drain()` (SIGTERM/SIGINT, via the CLI) stops fetching and lets in-flight work finish within
`shutdown_timeout_s`; what is left after that is failed with `shutting_down`. Then offsets are
committed and the clients closed. `run()` returns once everything has stopped.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import structlog

from actors.config import WorkerConfig
from actors.emitter import EmitterActor
from actors.gpu_actor import EngineLike, GpuActor
from actors.ingest import IngestActor
from actors.model_front import ModelFront

log = structlog.get_logger("tokenmill.worker")


class Worker:
    def __init__(
        self,
        config: WorkerConfig,
        engine: EngineLike,
        front: ModelFront,
        engine_thread: ThreadPoolExecutor | None = None,
    ) -> None:
        """`engine_thread`: the thread the engine was built on, to step it on (see
        `actors.engine_thread`)."""
        self.config = config
        self.front = front
        self.emitter = EmitterActor(config)
        self.gpu = GpuActor(engine, front.ref, self.emitter, config.worker_id, engine_thread)
        self.ingest = IngestActor(config, front, self.gpu, self.emitter)
        self.emitter.ingest = self.ingest
        self._drain = asyncio.Event()
        self.started = asyncio.Event()

    def drain(self) -> None:
        """Begin a graceful shutdown. Safe to call more than once, from a signal handler too."""
        if not self._drain.is_set():
            log.info("worker_draining", timeout_s=self.config.shutdown_timeout_s)
        self._drain.set()

    async def run(self) -> None:
        log.info(
            "worker_started",
            worker=self.config.worker_id,
            model=self.front.name,
            digest=self.front.digest,
            group=self.config.group,
            topic=self.config.requests_topic,
        )
        async with asyncio.TaskGroup() as tg:
            emitting = tg.create_task(self.emitter.run(), name="emitter")
            stepping = tg.create_task(self.gpu.run(), name="gpu")
            ingesting = tg.create_task(self.ingest.run(), name="ingest")
            self.started.set()
            await self._drain.wait()
            self.ingest.stop()
            try:
                await asyncio.wait_for(asyncio.shield(ingesting), self.config.shutdown_timeout_s)
            except TimeoutError:
                log.warning("drain_timeout", running=len(self.gpu.running))
            self.gpu.stop()  # fails whatever is left; the ingest then sees every outcome
            await stepping
            while not ingesting.done():  # a batch the ingest was still handing over
                await self.gpu.fail_queued()
                await asyncio.wait({ingesting}, timeout=0.1)
            self.emitter.stop()
            await emitting
        log.info(
            "worker_stopped",
            records=self.ingest.records_read,
            results=self.emitter.results_sent,
            dlq=self.emitter.dead_letters_sent,
        )
