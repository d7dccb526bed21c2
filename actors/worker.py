"""A worker: the ingest, GPU and emitter actors (plus control and HTTP) under one supervisor.

    ingest ──Batch──► gpu ──Outcome──► emitter ──Delivered──► ingest
       ▲               │ UseModel (after a model flip)
       └───────────────┘
    control ──VerifiedCommand──► supervisor ──SwapOrder──► gpu;  events ◄── every actor

`drain()` (SIGTERM/SIGINT, via the CLI) stops fetching and lets in-flight work finish within
`shutdown_timeout_s`; what is left after that is failed with `shutting_down`. Then offsets are
committed and the clients closed. `run()` returns once everything has stopped; `exit_code`
then says whether the worker ended cleanly (0) or gave up (1).
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import structlog

from actors.config import WorkerConfig
from actors.emitter import EmitterActor
from actors.faults import Faults
from actors.gpu_actor import EngineLike, GpuActor
from actors.ingest.actor import IngestActor
from actors.ingest.model_front import ModelFront, result_size_refusal
from actors.supervisor import Supervisor
from actors.swap.model_paths import AliasResolver
from actors.swap.swapper import EngineBuilder, Swapper, SwapSettings, engine_builder_like
from actors.telemetry.gpu_utilization import GpuUtilizationSampler
from actors.telemetry.tracing import installed_span_recorder
from gpu.memory.device_memory import device_memory

log = structlog.get_logger("tokenmill.worker")


class Worker:
    def __init__(
        self,
        config: WorkerConfig,
        engine: EngineLike,
        front: ModelFront,
        engine_thread: ThreadPoolExecutor | None = None,
        *,
        build: EngineBuilder | None = None,
        aliases: AliasResolver | None = None,
        faults: Faults | None = None,
        metrics: Any = None,
    ) -> None:
        """`engine_thread`: the thread the engine was built on, to step it on (see
        `actors.engine_thread`). `build(path)`: how a swap builds an engine for another
        checkpoint (default: like `engine`). `metrics`: a `WorkerMetrics` to fill, if any."""
        refusal = result_size_refusal(front, config.producer_max_bytes)
        if refusal is not None:
            raise ValueError(refusal)  # it could make a result it cannot send
        self.config = config
        self.front = front
        self.metrics = metrics
        self._lag_partitions: set[int] = set()
        self._gpu_utilization = GpuUtilizationSampler()  # NVML is loaded on the first sample
        self.emitter = EmitterActor(config)
        self.gpu = GpuActor(
            engine,
            self.emitter,
            config.worker_id,
            engine_thread,
            front=front,
            faults=faults,
            on_step=(lambda out: metrics.observe_step(out.stats)) if metrics else None,
        )
        self.ingest = IngestActor(config, front, self.gpu, self.emitter)
        self.emitter.ingest = self.ingest
        self.gpu.ingest = self.ingest
        self.gpu.swapper = Swapper(
            build or engine_builder_like(engine),
            SwapSettings(
                config.swap_memory_budget_bytes,
                config.keep_previous_model,
                max_result_bytes=config.producer_max_bytes,
            ),
            on_swap=metrics.swap if metrics else None,
        )
        self.emitter.metrics = self.ingest.metrics = metrics
        self.control = self._control()
        self.gpu.events = self.control
        self.supervisor = Supervisor(
            config,
            self.ingest,
            self.gpu,
            self.emitter,
            control=self.control,
            http=None,
            models_dir=Path(config.models_dir) if config.models_dir else None,
            aliases=aliases,
            on_restart=metrics.child_restarted if metrics else None,
        )
        if self.control is not None:
            self.control.commands = self.supervisor
        self.supervisor.http = self._http()

    @property
    def started(self) -> asyncio.Event:
        return self.supervisor.started

    @property
    def exit_code(self) -> int:
        return self.supervisor.exit_code

    def drain(self) -> None:
        """Begin a graceful shutdown. Safe to call more than once, from a signal handler too."""
        self.supervisor.drain()

    async def run(self) -> None:
        log.info(
            "worker_started",
            worker=self.config.worker_id,
            model=self.front.name,
            digest=self.front.digest,
            group=self.config.group,
            topic=self.config.requests_topic,
        )
        await self.supervisor.run()

    def _control(self) -> Any:
        if self.config.control_topic is None:
            return None
        from actors.control import ControlActor

        return ControlActor(self.config, None)  # commands: the supervisor, wired below

    def _http(self) -> Any:
        if self.config.http_port is None:
            return None
        from actors.http_server import HttpServer

        return HttpServer(
            self.config.http_host, self.config.http_port, self.supervisor.readiness, self.scrape
        )

    def scrape(self) -> bytes:
        """/metrics: gauges that describe the present are read now, then everything rendered."""
        metrics = self.metrics
        if metrics is None:
            return b""
        gpu, ingest = self.gpu, self.ingest
        standby = gpu.holder.standby
        metrics.set_models(
            (gpu.front.name, gpu.front.digest),
            (standby.model.name, standby.model.digest) if standby is not None else None,
        )
        metrics.set_queue_depth(max(ingest.backpressure.requests - len(gpu.running), 0))
        consumer = ingest.consumer
        paused = len(consumer.paused()) if consumer is not None and ingest.joined else 0
        metrics.set_paused_partitions(paused)
        lag = ingest.lag()
        for partition in self._lag_partitions - lag.keys():
            metrics.forget_partition(partition)
        for partition, records in lag.items():
            metrics.set_consumer_lag(partition, records)
        self._lag_partitions = set(lag)
        recorder = installed_span_recorder()
        if recorder is not None and recorder.counts is not None:
            metrics.set_trace_spans(*recorder.counts())
        devices = device_memory()
        for device in devices:
            metrics.set_device_memory(device.device, device.allocated, device.reserved)
        if devices:  # on CUDA: a worker on CPU reports no GPU, even on a machine that has one
            metrics.set_gpu_utilization(self._gpu_utilization.sample())
        return bytes(metrics.render())
