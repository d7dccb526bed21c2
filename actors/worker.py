"""A worker: the ingest, GPU and emitter actors (plus control and HTTP) under one supervisor.

    ingest ──Batch──► gpu ──Outcome──► emitter ──Delivered──► ingest
       ▲               │ UseModel (after a model flip)
       └───────────────┘
    control ──VerifiedCommand──► supervisor ──SwapOrder──► gpu;  events ◄── every actor
    cancel ──Cancel──► ingest ──Cancel──► gpu   (a request cancelled wherever it is held)
    broker watch ──reachable──► health ◄── /readyz
    engine thread ──steps──► watchdog ──stalled──► supervisor, health ◄── /healthz
    memory guard ──over --max-rss──► supervisor (drain)

The mailboxes are made first; each actor gets its own and the addresses it sends to through
its constructor (nothing is wired afterwards), so the circles above need no back-references.

`drain()` (SIGTERM/SIGINT, via the CLI) stops fetching and lets in-flight work finish within
`shutdown_timeout_s`; what is left after that is failed with `shutting_down`. Then offsets are
committed and the clients closed. `run()` returns once everything has stopped; `exit_code`
then says whether the worker ended cleanly (0) or gave up (1); `engine_busy` whether a step
is still running on the engine thread (hung: the process must not wait for it to exit).
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import structlog

from actors.cancel.actor import CancelActor
from actors.config import WorkerConfig
from actors.control import ControlActor
from actors.emitter import EmitterActor
from actors.emitter import Mail as EmitterMail
from actors.faults import Faults
from actors.gpu_actor import GpuActor
from actors.guards.memory_guard import MemoryGuard
from actors.guards.step_progress import StepProgress
from actors.guards.watchdog import Watchdog
from actors.health import Health
from actors.http_server import HttpServer
from actors.in_flight import EngineLike
from actors.ingest.actor import IngestActor
from actors.ingest.model_front import ModelFront, result_size_refusal
from actors.kafka.broker_watch import BrokerWatch
from actors.mail import Batch, Cancel, SwapOrder, VerifiedCommand
from actors.runtime import Mailbox
from actors.supervisor import Supervisor
from actors.swap.model_paths import AliasResolver
from actors.swap.swapper import EngineBuilder, Swapper, SwapSettings, engine_builder_like
from actors.telemetry.gpu_utilization import GpuUtilizationSampler
from actors.telemetry.metrics import WorkerMetrics
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
        metrics: WorkerMetrics | None = None,
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
        # The mailboxes first: the actors send to each other in circles (see the diagram).
        ingest_mail = IngestActor.new_mailbox(config)
        gpu_mail: Mailbox[Batch | SwapOrder | Cancel] = Mailbox(GpuActor.MAILBOX_SIZE)
        emitter_mail: Mailbox[EmitterMail] = Mailbox(EmitterActor.MAILBOX_SIZE)
        supervisor_mail: Mailbox[VerifiedCommand] = Mailbox(Supervisor.MAILBOX_SIZE)
        self.control = (
            ControlActor(config, supervisor_mail) if config.control_topic is not None else None
        )
        self.emitter = EmitterActor(config, emitter_mail, delivered=ingest_mail, metrics=metrics)
        self.gpu = GpuActor(
            engine,
            emitter_mail,
            config.worker_id,
            engine_thread,
            mailbox=gpu_mail,
            front=front,
            flips=ingest_mail,
            events=self.control,
            swapper=Swapper(
                build or engine_builder_like(engine),
                SwapSettings(
                    config.swap_memory_budget_bytes,
                    config.keep_previous_model,
                    max_result_bytes=config.producer_max_bytes,
                ),
                on_swap=metrics.swap if metrics else None,
            ),
            faults=faults,
            on_step=(lambda out: metrics.observe_step(out.stats)) if metrics else None,
            streaming=config.streaming,
            on_cancel=metrics.observe_cancel if metrics else None,
            progress=StepProgress(config.watchdog_floor_s, config.watchdog_step_multiple),
        )
        self.ingest = IngestActor(
            config,
            front,
            ingest_mail,
            batches=gpu_mail,
            outcomes=emitter_mail,
            metrics=metrics,
            transactions=emitter_mail if config.exactly_once else None,
        )
        self.cancel = (
            CancelActor(config, self.ingest.cancels) if config.cancel_topic is not None else None
        )
        self.broker_watch = BrokerWatch(config.kafka)  # readiness says when the broker is away
        health = Health(self.ingest, self.gpu, self.control, self.broker_watch, cancel=self.cancel)
        http = (
            HttpServer(
                config.http_host,
                config.http_port,
                health.readiness,
                self.scrape,
                live=health.liveness,
            )
            if config.http_port is not None
            else None
        )
        self.supervisor = Supervisor(
            config,
            self.ingest,
            self.gpu,
            self.emitter,
            supervisor_mail,
            control=self.control,
            cancel=self.cancel,
            http=http,
            broker_watch=self.broker_watch,
            health=health,
            models_dir=Path(config.models_dir) if config.models_dir else None,
            aliases=aliases,
            on_restart=metrics.child_restarted if metrics else None,
            guards=self._guards(metrics),
        )

    def _guards(self, metrics: WorkerMetrics | None) -> tuple[Watchdog, MemoryGuard]:
        def stalled(reason: str) -> None:
            if metrics is not None:
                metrics.engine_stalled()
            linger = self.gpu.faults.stall_linger_s  # test-only: 0 unless a test asks
            if linger > 0:
                self.supervisor.health.stalled = reason
                loop = asyncio.get_running_loop()
                loop.call_later(linger, self.supervisor.engine_stalled, reason)
            else:
                self.supervisor.engine_stalled(reason)

        watchdog = Watchdog(
            self.gpu.progress,
            stalled,
            on_check=metrics.observe_engine_progress if metrics else None,
        )
        memory = MemoryGuard(
            self.config.max_rss,
            lambda reason: self.supervisor.drain(reason),
            on_sample=metrics.observe_rss if metrics else None,
        )
        return watchdog, memory

    @property
    def started(self) -> asyncio.Event:
        return self.supervisor.started

    @property
    def exit_code(self) -> int:
        return self.supervisor.exit_code

    @property
    def engine_busy(self) -> bool:
        """A step is running on the engine thread (after `run()`: one that never returned)."""
        return self.gpu.progress.running_since is not None

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

    def scrape(self) -> bytes:
        """/metrics: gauges that describe the present are read now, then everything rendered."""
        metrics = self.metrics
        if metrics is None:
            return b""
        gpu, ingest = self.gpu, self.ingest
        standby = gpu.standby
        metrics.set_models(
            (gpu.front.name, gpu.front.digest, gpu.front.quantization),
            (standby.name, standby.digest, standby.quantization) if standby is not None else None,
        )
        metrics.set_queue_depth(max(ingest.outstanding - gpu.running, 0))
        metrics.set_paused_partitions(ingest.paused_partitions)
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
