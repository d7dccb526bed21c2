"""What one `bench pipeline` run is asked to do (`PipelineOptions`) and what its sections share
(`PipelineRun`); apart from `ops/bench/pipeline.py` so the report and tracing sections can
name them without importing the benchmark that imports them."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from actors.kafka.connection import KafkaConnection
from ops.bench.narrate import Narrate
from ops.bench.worker import CpuMeter
from ops.bench.workload import BenchOptions
from ops.models.engine_options import EngineChoice
from ops.services.topics import create_topics

SECTIONS = ("throughput", "latency", "ceiling", "tracing")
DEFAULT_SECTIONS = ("throughput", "latency", "ceiling")  # tracing: on request (--only tracing)
WARM_UP_REQUESTS = 16  # the model sections' unmeasured first batch, on both paths


@dataclass(frozen=True)
class PipelineOptions:
    engine: EngineChoice  # the direct engine's, and the worker's engine options
    workload: BenchOptions = field(default_factory=BenchOptions)  # as `bench engine`'s
    sections: tuple[str, ...] = DEFAULT_SECTIONS
    kafka: KafkaConnection | None = None  # None: start a broker for this run
    partitions: int = 6
    throughput_rounds: int = 3  # direct and Kafka runs taking turns; the median ratio
    rate: float | None = None  # latency, requests/s; None: light for the engine (`light_rate`)
    latency_requests: int = 20
    latency_max_new_tokens: int = 16
    echo_requests: int = 20_000
    echo_prompt_tokens: int = 16
    tracing_requests: int = 5_000  # per run; runs alternate off, on, off, on
    tracing_model_requests: int = 48  # per run to a worker on the model; 0: echo only
    timeout_s: float = 600.0  # per wait for a worker's results

    def __post_init__(self) -> None:
        unknown = set(self.sections) - set(SECTIONS)
        if unknown or not self.sections:
            raise ValueError(f"sections must be some of {', '.join(SECTIONS)}")
        if (self.rate is not None and self.rate <= 0) or self.timeout_s <= 0:
            raise ValueError("rate and timeout must be positive")
        if self.throughput_rounds < 1:
            raise ValueError("throughput_rounds must be at least 1")

    # The model sections' workloads, each on a seed of its own, so that none finds another's
    # prompts in a prefix cache: the rounds on seed, seed + 1, ...; then the warm-up; then
    # the latency run.

    def round_specs(self) -> list[BenchOptions]:
        """One per throughput round: `bench engine`'s workload first, then the next seeds'."""
        w = self.workload
        return [replace(w, seed=w.seed + r) for r in range(self.throughput_rounds)]

    def warm_up_spec(self) -> BenchOptions:
        """The unmeasured first batch on both paths: fewer requests of the same shape."""
        w = self.workload
        requests = min(WARM_UP_REQUESTS, w.requests)
        return replace(w, seed=w.seed + self.throughput_rounds, requests=requests)

    def latency_spec(self) -> BenchOptions:
        """The latency run's prompts (their output lengths are `latency_max_new_tokens`)."""
        w = self.workload
        seed = w.seed + self.throughput_rounds + 1
        return replace(w, seed=seed, requests=self.latency_requests)


@dataclass
class PipelineRun:
    """What every section of one run shares."""

    options: PipelineOptions
    kafka: KafkaConnection  # the given broker's, or the one started for this run
    broker_pid: int | None  # when this run started the broker
    run_id: str
    tmp: Path
    report: dict[str, Any]
    say: Narrate
    topics_made: list[str] = field(default_factory=list)

    async def topics(self, kind: str) -> dict[str, str]:
        """Fresh requests/results/dlq/cancel topics per worker, so no worker reads another's
        requests (the worker listens for cancels as a deployed one does)."""
        base = f"tokenmill-bench-{self.run_id}-{kind}"
        names = {role: f"{base}.{role}" for role in ("requests", "results", "dlq", "cancel")}
        await create_topics(self.kafka, requests_partitions=self.options.partitions, names=names)
        self.topics_made += names.values()
        return names

    def meter(self, worker: asyncio.subprocess.Process) -> CpuMeter:
        return CpuMeter({"worker": worker.pid, "client": os.getpid(), "broker": self.broker_pid})
