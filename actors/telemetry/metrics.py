"""The worker's Prometheus metrics, in a registry of its own, rendered for `/metrics`.

Each `WorkerMetrics` holds a private `CollectorRegistry`, so several workers in one process
(tests, a bench) never share series. The names the Grafana dashboard reads are a contract,
listed in compose/README.md; the rest (model info, steps, swaps, restarts, process and device
memory, GPU utilisation) are for operators. Every method is cheap and does no I/O: actors call
them inline on the event loop, and only `render()` (the scrape) reads /proc for the process
collector.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Literal, get_args

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)

from actors.emit.retries import TRANSIENT_CODES
from actors.mail import CancelledIn, FlushReason
from actors.result_shapes import finish_of
from actors.telemetry.embed_metrics import EmbedMetrics
from actors.telemetry.speculative_metrics import SpeculativeMetrics
from actors.telemetry.step_metrics import StepMetrics
from messages.embedding import EmbedResult

if TYPE_CHECKING:
    from collections.abc import Iterable

    from actors.telemetry.gpu_utilization import GpuUtilization
    from gpu.engine import StepStats  # gpu.engine imports torch; only its fields are read here
    from messages.request_kinds import Result

__all__ = ["SwapOutcome", "WorkerMetrics"]

SwapOutcome = Literal["swapped", "failed", "refused"]
_SWAP_OUTCOMES: tuple[str, ...] = get_args(SwapOutcome)

# Latencies span a GPU's milliseconds and a CPU's tens of seconds.
DURATION_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
TPOT_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5,
)  # fmt: skip
SWAP_PAUSE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
BATCH_TOKENS_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)


class WorkerMetrics:
    """One worker's metrics. Counters take `_total` from prometheus_client on exposition."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        # Process CPU, RSS, open fds... as tokenmill_process_* (Linux only; empty elsewhere).
        ProcessCollector(namespace="tokenmill", registry=r)

        # The dashboard contract (compose/README.md).
        self.requests = Counter(
            "tokenmill_requests",
            "Finished requests by outcome (the finish reason) and, for errors, the error code.",
            ["outcome", "code"],
            registry=r,
        )
        self.generated_tokens = Counter(
            "tokenmill_generated_tokens", "Tokens generated.", registry=r
        )
        self.batch_size = Histogram(
            "tokenmill_batch_size",
            "Requests per batch flushed from a length bucket.",
            buckets=BATCH_SIZE_BUCKETS,
            registry=r,
        )
        self.batch_tokens = Histogram(
            "tokenmill_batch_tokens",
            "Prompt tokens per flushed batch.",
            buckets=BATCH_TOKENS_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "tokenmill_ttft_seconds",
            "Time to first token, from the request's arrival.",
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(
            "tokenmill_tpot_seconds",
            "Time per output token after the first.",
            buckets=TPOT_BUCKETS,
            registry=r,
        )
        self.request_duration = Histogram(
            "tokenmill_request_duration_seconds",
            "End to end, from the request's arrival to its result.",
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.queue_depth = Gauge(
            "tokenmill_queue_depth", "Requests admitted and waiting for the engine.", registry=r
        )
        self.consumer_lag = Gauge(
            "tokenmill_consumer_lag",
            "Records on the requests topic not yet consumed, per partition.",
            ["partition"],
            registry=r,
        )
        self.bucket_flushes = Counter(
            "tokenmill_bucket_flushes",
            "Length-bucket flushes by reason.",
            ["reason"],
            registry=r,
        )
        self.prompt_tokens = Counter(
            "tokenmill_prompt_tokens", "Prompt tokens of finished requests.", registry=r
        )

        # For operators.
        self.model_info = Gauge(
            "tokenmill_model_info",
            "1 for the active model and the standby one (slot), by name, weights digest and "
            "quantization (none, int8, int4-g32, or a mix such as int4-g32+int8-g32).",
            ["name", "digest", "quantization", "slot"],
            registry=r,
        )
        self.paused_partitions = Gauge(
            "tokenmill_paused_partitions",
            "Assigned partitions paused by backpressure.",
            registry=r,
        )
        self.child_restarts = Counter(
            "tokenmill_child_restarts",
            "Actors restarted by the supervisor after a crash.",
            ["child"],
            registry=r,
        )
        self.send_failures = Counter(
            "tokenmill_send_failures",
            "Results and dead letters whose send failed, by what the emitter did: retried "
            "(the broker was away), answered (refused for good: an error result instead), "
            "replaced_producer (the producer was unusable).",
            ["action"],
            registry=r,
        )
        self.retries = Counter(
            "tokenmill_retries",
            "Requests sent to a retry topic for another attempt, by why their attempt failed "
            "(engine_error, shutting_down).",
            ["reason"],
            registry=r,
        )
        self.model_swaps = Counter(
            "tokenmill_model_swaps",
            "Model swaps by outcome (swapped, failed, refused).",
            ["outcome"],
            registry=r,
        )
        self.trace_spans = Counter(
            "tokenmill_trace_spans",
            "Worker spans by fate: handed_on (written to the span export process's pipe; "
            "what it then fails to send is in its log) or dropped before that (the queue was "
            "full, or the process was down).",
            ["outcome"],
            registry=r,
        )
        self._trace_spans_seen = {"handed_on": 0, "dropped": 0}
        self.stream_chunks = Counter(
            "tokenmill_stream_chunks",
            "GenerateChunk records of streamed requests acknowledged by the broker.",
            registry=r,
        )
        self.cancels = Counter(
            "tokenmill_cancels",
            "Cancel records by where this worker found the request: bucket, queue, engine, "
            "none (not held here: unknown, finished, or on another worker), or arrival (it "
            "came after its cancel and was answered at once). Cancelled "
            'results are also in tokenmill_requests{outcome="cancelled"}.',
            ["found"],
            registry=r,
        )
        self.swap_pause = Histogram(
            "tokenmill_swap_pause_seconds",
            "How long admission was paused for a model swap's flip.",
            buckets=SWAP_PAUSE_BUCKETS,
            registry=r,
        )
        self.device_memory_allocated = Gauge(
            "tokenmill_device_memory_allocated_bytes",
            "Accelerator memory held by tensors, per device (none on CPU).",
            ["device"],
            registry=r,
        )
        self.device_memory_reserved = Gauge(
            "tokenmill_device_memory_reserved_bytes",
            "Accelerator memory reserved by the caching allocator, per device (none on CPU).",
            ["device"],
            registry=r,
        )
        self.gpu_utilization = Gauge(
            "tokenmill_gpu_utilization_ratio",
            "Share of NVML's last sample period in which a kernel ran (0-1), per NVML device; "
            "only with a CUDA device.",
            ["device"],
            registry=r,
        )
        self.gpu_memory_bandwidth_utilization = Gauge(
            "tokenmill_gpu_memory_bandwidth_utilization_ratio",
            "Share of NVML's last sample period in which device memory was read or written "
            "(0-1), per NVML device; only with a CUDA device.",
            ["device"],
            registry=r,
        )

        self.steps = StepMetrics(r)
        self.speculative = SpeculativeMetrics(r)
        self.embedding = EmbedMetrics(r)

        # The guards (actors/guards). RSS itself is tokenmill_process_resident_memory_bytes.
        self.step_running = Gauge(
            "tokenmill_engine_step_running_seconds",
            "How long the engine's current step has run (0 between steps), at the watchdog's "
            "last look.",
            registry=r,
        )
        self.stall_bound = Gauge(
            "tokenmill_engine_stall_bound_seconds",
            "How long a step may run before the watchdog counts the engine as hung.",
            registry=r,
        )
        self.engine_stalls = Counter(
            "tokenmill_engine_stalls",
            "Hung engine steps the watchdog found (the worker then leaves its group, exits 1).",
            registry=r,
        )
        self.rss_growth = Gauge(
            "tokenmill_rss_growth_bytes_per_second",
            "How fast the resident set grew over the last minute (negative: it shrank).",
            registry=r,
        )
        self.max_rss = Gauge(
            "tokenmill_max_rss_bytes",
            "--max-rss: past it the worker drains and exits 0 (0: no limit).",
            registry=r,
        )

        # Known label values start at 0, so rate() sees the first increment.
        for reason in get_args(FlushReason):
            self.bucket_flushes.labels(reason)
        for outcome in _SWAP_OUTCOMES:
            self.model_swaps.labels(outcome)
        for outcome in self._trace_spans_seen:
            self.trace_spans.labels(outcome)
        for found in (*get_args(CancelledIn), "none"):
            self.cancels.labels(found)
        for code in sorted(TRANSIENT_CODES):
            self.retries.labels(code.value)

    def observe_outcome(self, result: Result, *, admitted: bool) -> None:
        """A finished request. Latencies count only for requests that reached the engine.

        `outcome` is the finish reason (`error` among them; a deadline is `deadline`; an
        embedding request's from its error: `result_shapes.finish_of`), and `code` the error
        code, or "" when there is none.
        """
        code = result.error.code.value if result.error is not None else ""
        self.requests.labels(finish_of(result).value, code).inc()
        self.prompt_tokens.inc(result.usage.prompt_tokens)
        if isinstance(result, EmbedResult):
            self.embedding.observe(result)
        else:
            self.generated_tokens.inc(result.usage.completion_tokens)
        if not admitted:
            return  # refused at the door: no timings worth a histogram
        timings = result.timings
        if timings.ttft_ms is not None:
            self.ttft.observe(timings.ttft_ms / 1e3)
        if timings.tpot_ms is not None:
            self.tpot.observe(timings.tpot_ms / 1e3)
        self.request_duration.observe(timings.total_ms / 1e3)

    def retried(self, reason: str) -> None:
        """A request's attempt failed for `reason` (its error code); it goes to a retry topic."""
        self.retries.labels(reason).inc()

    def observe_cancel(self, found: CancelledIn | None) -> None:
        """A cancel record handled: where it found its request (None: not held here)."""
        self.cancels.labels(found or "none").inc()

    def observe_batch(self, size: int, tokens: int, reason: str) -> None:
        """A batch flushed from a length bucket: `size` requests, `tokens` prompt tokens."""
        self.batch_size.observe(size)
        self.batch_tokens.observe(tokens)
        self.bucket_flushes.labels(reason).inc()

    def observe_step(self, stats: StepStats) -> None:
        """One engine step (`actors/telemetry/step_metrics.py`), and speculation's guesses."""
        self.steps.observe_step(stats)
        self.speculative.observe_step(stats)

    def set_queue_depth(self, n: int) -> None:
        self.queue_depth.set(n)

    def set_paused_partitions(self, n: int) -> None:
        self.paused_partitions.set(n)

    def set_consumer_lag(self, partition: int, lag: int) -> None:
        self.consumer_lag.labels(str(partition)).set(lag)

    def forget_partition(self, partition: int) -> None:
        """Drop a revoked partition's lag series, so a stale lag does not linger."""
        with contextlib.suppress(KeyError):  # never reported
            self.consumer_lag.remove(str(partition))

    def set_models(
        self, active: tuple[str, str, str], standby: tuple[str, str, str] | None
    ) -> None:
        """The models now loaded, as (name, digest, quantization); replaces the previous
        info series."""
        self.model_info.clear()
        self.model_info.labels(*active, "active").set(1)
        if standby is not None:
            self.model_info.labels(*standby, "standby").set(1)

    def set_device_memory(self, device: str, allocated: int, reserved: int) -> None:
        """An accelerator's memory in bytes, e.g. for "cuda:0" (the caller reads it from torch).

        Not called on CPU, so a CPU worker exposes no series rather than a misleading 0.
        """
        self.device_memory_allocated.labels(device).set(allocated)
        self.device_memory_reserved.labels(device).set(reserved)

    def set_gpu_utilization(self, gpus: Iterable[GpuUtilization]) -> None:
        """The GPUs' utilisation now, labelled by NVML index ("nvml:0"; not torch's cuda:N).

        Replaces the previous series, so a GPU that did not answer this time has none rather
        than a stale value. Not called on CPU, like `set_device_memory`.
        """
        self.gpu_utilization.clear()
        self.gpu_memory_bandwidth_utilization.clear()
        for gpu in gpus:
            device = f"nvml:{gpu.index}"
            self.gpu_utilization.labels(device).set(gpu.gpu)
            self.gpu_memory_bandwidth_utilization.labels(device).set(gpu.memory_bandwidth)

    def observe_engine_progress(self, running_s: float, bound_s: float) -> None:
        """The watchdog's look: the current step's age, and the bound it is held to."""
        self.step_running.set(running_s)
        self.stall_bound.set(bound_s)

    def engine_stalled(self) -> None:
        self.engine_stalls.inc()

    def observe_rss(self, growth_bytes_per_s: float, limit: int | None) -> None:
        """The memory guard's sample: the resident set's growth rate, and its limit if any."""
        self.rss_growth.set(growth_bytes_per_s)
        if limit is not None:
            self.max_rss.set(limit)

    def child_restarted(self, child: str) -> None:
        self.child_restarts.labels(child).inc()

    def chunk_sent(self) -> None:
        """A streamed request's chunk was acknowledged."""
        self.stream_chunks.inc()

    def send_failed(self, action: str) -> None:
        """A send failed and the emitter `action`: retried, answered, replaced_producer."""
        self.send_failures.labels(action).inc()

    def swap(self, outcome: SwapOutcome, pause_s: float | None = None) -> None:
        """A model swap ended; `pause_s` is how long admission was paused, when it was."""
        if outcome not in _SWAP_OUTCOMES:
            raise ValueError(f"swap outcome must be one of {_SWAP_OUTCOMES}, got {outcome!r}")
        self.model_swaps.labels(outcome).inc()
        if pause_s is not None:
            self.swap_pause.observe(pause_s)

    def set_trace_spans(self, handed_on: int, dropped: int) -> None:
        """The span sink's running totals (they only grow); the counters follow them."""
        for outcome, total in (("handed_on", handed_on), ("dropped", dropped)):
            seen = self._trace_spans_seen[outcome]
            if total > seen:
                self.trace_spans.labels(outcome).inc(total - seen)
                self._trace_spans_seen[outcome] = total

    def render(self) -> bytes:
        """The registry in the Prometheus text format 0.0.4 (what `/metrics` serves)."""
        return generate_latest(self.registry)
