"""The worker's settings as the actors see them: plain frozen values, validated on creation.

`ops/worker/settings.py` fills these from flags, `TOKENMILL_*` env vars and a TOML file.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

from actors.ingest.backpressure import Watermarks
from actors.ingest.buckets import BucketConfig, default_boundaries
from actors.kafka.connection import KafkaConnection
from actors.streaming.policy import StreamPolicy

DEFAULT_REQUESTS_TOPIC = "tokenmill.requests"
DEFAULT_RESULTS_TOPIC = "tokenmill.results"
DEFAULT_DLQ_TOPIC = "tokenmill.dlq"
DEFAULT_CONTROL_TOPIC = "tokenmill.control"
DEFAULT_EVENTS_TOPIC = "tokenmill.events"
DEFAULT_CANCEL_TOPIC = "tokenmill.cancel"
DEFAULT_MAX_MESSAGE_BYTES = 4 << 20
# Beyond a dead letter's value (at most max_request_bytes): its key (messages.limits), the
# original headers it keeps (DEAD_LETTER_HEADER_BYTES) and the headers saying why.
DEAD_LETTER_HEADER_BYTES = 64 << 10
DEAD_LETTER_ROOM = 128 << 10


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class WorkerConfig:
    kafka: KafkaConnection = field(default_factory=KafkaConnection)  # brokers, TLS, SASL
    group: str = "tokenmill"
    # Static membership (KIP-345): a worker restarted under the same id within the session
    # timeout gets its partitions back, and no other worker's assignment moves meanwhile.
    group_instance_id: str | None = None
    session_timeout_ms: int = 10_000
    # How long a starting client waits for its broker before the worker gives up (exit 1);
    # None: as long as it takes.
    connect_timeout_s: float | None = None
    requests_topic: str = DEFAULT_REQUESTS_TOPIC
    results_topic: str = DEFAULT_RESULTS_TOPIC
    dlq_topic: str = DEFAULT_DLQ_TOPIC
    events_topic: str = DEFAULT_EVENTS_TOPIC
    worker_id: str = field(default_factory=default_worker_id)
    max_request_bytes: int = 1 << 20  # larger records are refused with message_too_large
    fetch_max_records: int = 500  # per getmany
    commit_interval_s: float = 1.0
    shutdown_timeout_s: float = 30.0
    bucket_boundaries: tuple[int, ...] | None = None  # None: powers of two up to max_model_len
    max_batch_tokens: int = 8192
    max_batch_size: int = 64
    max_wait_ms: float = 10.0
    watermarks: Watermarks = field(default_factory=Watermarks)
    emit_max_in_flight: int = 4096  # results sent but not yet acknowledged
    # How long the producer tries to deliver a record before its send fails (and the emitter
    # sends it again, after a backoff): aiokafka's request_timeout_ms.
    delivery_timeout_ms: int = 40_000
    # The largest record the emitter's producer sends (None: 4 MiB, or more when a dead letter
    # of max_request_bytes needs it). Checked at start against the largest possible result.
    max_message_bytes: int | None = None
    # Patterns (fnmatch) a request's reply_to must match, beside the results topic; None:
    # `*.results`. Internal topics and the worker's own are refused whatever the patterns.
    allowed_reply_to: tuple[str, ...] | None = None
    linger_ms: int = 2
    # How long the broker may hold a fetch that has no data yet. 10 ms instead of aiokafka's
    # 500 cut a record's trip to the worker from ~38 to ~18 ms (p50, 3 partitions), but the
    # idle fetches it adds slowed a CPU engine sharing 2 cores with the broker by ~40%
    # (measured with `bench pipeline --only latency`). Lower it where cores are not scarce.
    fetch_max_wait_ms: int = 500
    log_sample_rate: float = 0.01  # share of successful requests logged as request_done
    log_payloads: bool = False  # prompt and output text in request logs (never by default)
    # Control plane: commands on `control_topic` are applied only when signed with this secret
    # (HMAC-SHA256); None refuses every command. Swapped-to models must lie in `models_dir`.
    control_topic: str | None = None  # None: no control plane (the CLI defaults it on)
    control_secret: str | None = field(default=None, repr=False)
    models_dir: str | None = (
        None  # None: the model cache (`ops.models.registry.cache_dir()/models`)
    )
    # Cancellation: `CancelRequest`s on this topic stop requests wherever this worker holds
    # them (every worker reads it, in a group of its own). None: no cancel reader.
    cancel_topic: str | None = None  # the CLI defaults it on
    # Swaps: None lets the device's free memory decide whether both models fit; a number of
    # bytes caps what all loaded models plus their KV pools may hold (below it: drain mode).
    swap_memory_budget_bytes: int | None = None
    keep_previous_model: bool = True  # keep the old model in standby so rollback is a flip
    # Health and metrics over HTTP (/healthz, /readyz, /metrics); None: no HTTP server.
    http_host: str = "0.0.0.0"
    http_port: int | None = None
    # Supervision: a child that crashes more than `max_restarts` times in `restart_window_s`
    # makes the worker drain and exit non-zero.
    max_restarts: int = 5
    restart_window_s: float = 60.0
    # A record in flight when this many workers died in a row is quarantined (crash_guard).
    max_record_crashes: int = 3
    # Streamed requests: default chunk intervals, and the floor between two chunks.
    streaming: StreamPolicy = field(default_factory=StreamPolicy)

    @property
    def producer_max_bytes(self) -> int:
        """The producer's `max_request_size`: results and dead letters up to this are sent."""
        if self.max_message_bytes is not None:
            return self.max_message_bytes
        return max(DEFAULT_MAX_MESSAGE_BYTES, self.max_request_bytes + DEAD_LETTER_ROOM)

    def __post_init__(self) -> None:
        positive = {
            "max_request_bytes": self.max_request_bytes,
            "fetch_max_records": self.fetch_max_records,
            "commit_interval_s": self.commit_interval_s,
            "shutdown_timeout_s": self.shutdown_timeout_s,
            "max_batch_tokens": self.max_batch_tokens,
            "max_batch_size": self.max_batch_size,
            "emit_max_in_flight": self.emit_max_in_flight,
            "max_record_crashes": self.max_record_crashes,
            "delivery_timeout_ms": self.delivery_timeout_ms,
        }
        for name, value in positive.items():
            if value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        if not 0.0 <= self.log_sample_rate <= 1.0:
            raise ValueError(f"log_sample_rate must be within [0, 1], got {self.log_sample_rate}")
        if self.max_wait_ms < 0:
            raise ValueError(f"max_wait_ms must be ≥ 0, got {self.max_wait_ms}")
        if not self.group:
            raise ValueError("group must not be empty")
        if self.producer_max_bytes < self.max_request_bytes + DEAD_LETTER_ROOM:
            raise ValueError(
                f"max_message_bytes ({self.producer_max_bytes}) must leave room for a dead "
                f"letter of max_request_bytes ({self.max_request_bytes}) plus "
                f"{DEAD_LETTER_ROOM} bytes of key and headers"
            )

    def bucket_config(self, max_model_len: int) -> BucketConfig:
        """The ingest's length buckets for a model of `max_model_len` tokens."""
        return BucketConfig(
            boundaries=self.bucket_boundaries or default_boundaries(max_model_len),
            max_batch_tokens=self.max_batch_tokens,
            max_batch_size=self.max_batch_size,
            max_wait_s=self.max_wait_ms / 1000,
        )
