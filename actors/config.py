"""The worker's settings as the actors see them: plain frozen values, validated on creation.

Each is declared once, here; `ops/settings.py` derives the worker's flags, `TOKENMILL_*` env
vars and TOML keys from the declarations.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

from actors.guards import step_progress
from actors.ingest.backpressure import Watermarks
from actors.ingest.buckets import BucketConfig, default_boundaries
from actors.ingest.reply_topics import DEFAULT_ALLOWED_PATTERNS
from actors.kafka.connection import KafkaConnection
from actors.streaming.policy import StreamPolicy

DEFAULT_REQUESTS_TOPIC = "tokenmill.requests"
DEFAULT_RESULTS_TOPIC = "tokenmill.results"
DEFAULT_DLQ_TOPIC = "tokenmill.dlq"
DEFAULT_CONTROL_TOPIC = "tokenmill.control"
DEFAULT_EVENTS_TOPIC = "tokenmill.events"
DEFAULT_CANCEL_TOPIC = "tokenmill.cancel"
DEFAULT_MAX_MESSAGE_BYTES = 4 << 20
DEFAULT_MAX_ATTEMPTS = 3  # a request's attempts before the DLQ: the original and two retries
# Beyond a dead letter's value (at most max_request_bytes): its key (messages.limits), the
# original headers it keeps (DEAD_LETTER_HEADER_BYTES) and the headers saying why.
DEAD_LETTER_HEADER_BYTES = 64 << 10
DEAD_LETTER_ROOM = 128 << 10


def retry_topic(requests_topic: str, retry: int) -> str:
    """The topic of a request's `retry`-th retry (its attempt `retry + 1`), Spring Kafka's way:
    `tokenmill.requests.retry.1` for the second attempt."""
    return f"{requests_topic}.retry.{retry}"


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class WorkerConfig:
    """Each field with a "help" is also a `tokenmill worker` setting: flag, `TOKENMILL_*` env
    var and TOML key, derived by `ops/settings.py` (see there for the metadata's keys)."""

    kafka: KafkaConnection = field(default_factory=KafkaConnection)  # ops/connection's options
    group: str = field(default="tokenmill", metadata={"help": "Consumer group."})
    group_instance_id: str | None = field(
        default=None,
        metadata={
            "help": "Static membership (KIP-345): a stable name per worker, unique in the group "
            "(`{hostname}` is replaced by the host's name: a StatefulSet pod's or a "
            "container's). Restarted within the session timeout, it gets its partitions back "
            "and no other worker's assignment moves."
        },
    )
    session_timeout_ms: int = field(
        default=10_000,
        metadata={
            "help": "How long the group waits for a silent worker before moving its partitions."
        },
    )
    connect_timeout_s: float | None = field(
        default=None,
        metadata={
            "help": "Seconds to wait for the broker at start before exiting 1 [default: wait "
            "as long as it takes, not ready meanwhile].",
            "old": "connect_timeout",
        },
    )
    requests_topic: str = field(
        default=DEFAULT_REQUESTS_TOPIC, metadata={"help": "Where requests are read from."}
    )
    results_topic: str = field(
        default=DEFAULT_RESULTS_TOPIC, metadata={"help": "Default reply topic."}
    )
    dlq_topic: str = field(
        default=DEFAULT_DLQ_TOPIC, metadata={"help": "Dead letters: records that cannot be read."}
    )
    events_topic: str = field(
        default=DEFAULT_EVENTS_TOPIC, metadata={"help": "Lifecycle and swap events."}
    )
    worker_id: str = field(
        default_factory=default_worker_id, metadata={"help": "Default: host-pid."}
    )
    max_request_bytes: int = field(
        default=1 << 20, metadata={"help": "Larger records are refused with message_too_large."}
    )
    fetch_max_records: int = 500  # per getmany
    commit_interval_s: float = field(
        default=1.0, metadata={"help": "Seconds between commits.", "old": "commit_interval"}
    )
    shutdown_timeout_s: float = field(
        default=30.0, metadata={"help": "Seconds to drain.", "old": "shutdown_timeout"}
    )
    handoff_timeout_s: float = field(
        default=10.0,
        metadata={
            "help": "On a rebalance, how long to wait for the answers of what is in flight on "
            "the partitions given up before committing them (what is not answered by then is "
            "answered again by the next owner)."
        },
    )
    bucket_boundaries: tuple[int, ...] | None = field(
        default=None,
        metadata={
            "help": "Comma-separated prompt lengths (default: powers of two to max_model_len)."
        },
    )
    max_batch_tokens: int = field(default=8192, metadata={"help": "Bucket flush: tokens."})
    max_batch_size: int = field(default=64, metadata={"help": "Bucket flush: requests."})
    max_wait_ms: float = field(default=10.0, metadata={"help": "Bucket flush: oldest wait."})
    watermarks: Watermarks = field(
        default_factory=Watermarks,
        metadata={
            "parts": {
                "high_requests": {
                    "help": "Pause fetching above this many queued requests.",
                    "old": "high_watermark_requests",
                },
                "high_tokens": {
                    "help": "Pause fetching above this many queued tokens.",
                    "old": "high_watermark_tokens",
                },
            }
        },
    )
    emit_max_in_flight: int = 4096  # results sent but not yet acknowledged
    exactly_once: bool = field(
        default=False,
        metadata={
            "help": "Write results, dead letters and consumed offsets in Kafka transactions, "
            "one transactional producer per input partition: a read_committed consumer sees "
            "each result once, whatever crashes, pauses or rebalances happen."
        },
    )
    transaction_interval_ms: float = field(
        default=100.0,
        metadata={
            "help": "With --exactly-once: the longest a finished result waits for its "
            "transaction (one also commits after each batch of completions).",
            "old": "transaction_interval",
        },
    )
    transaction_timeout_ms: int = 60_000  # the broker aborts a transaction left open this long
    delivery_timeout_ms: int = field(
        default=40_000,
        metadata={
            "help": "How long a result's send may take before it is sent again (the broker is "
            "waited for as long as it is away); aiokafka's request_timeout_ms."
        },
    )
    topic_metadata_wait_ms: float = field(
        default=10_000.0,
        metadata={
            "help": "How long a result for a topic the producer does not know (a reply_to "
            "deleted after admission, a broker slow to answer) waits, on its own, for the "
            "topic's metadata; then it is answered instead (reply_to_refused) if the broker "
            "says the topic is not there, or sent again later if the broker did not answer."
        },
    )
    max_message_bytes: int | None = field(
        default=None,
        metadata={
            "help": "Largest record the worker produces (default: 4 MiB, more if dead letters "
            "need it); the largest possible result must fit, checked at start."
        },
    )
    allowed_reply_to: tuple[str, ...] | None = field(
        default=None,  # None: DEFAULT_ALLOWED_PATTERNS
        metadata={
            "help": "Comma-separated patterns (fnmatch) a request's reply_to may match, beside "
            "the results topic; internal (__*) and the worker's own topics never.",
            "cli": DEFAULT_ALLOWED_PATTERNS,
        },
    )
    linger_ms: int = 2
    # How long the broker may hold a fetch that has no data yet. 10 ms instead of aiokafka's
    # 500 cut a record's trip to the worker from ~38 to ~18 ms (p50, 3 partitions), but the
    # idle fetches it adds slowed a CPU engine sharing 2 cores with the broker by ~40%
    # (measured with `bench pipeline --only latency`). Lower it where cores are not scarce.
    fetch_max_wait_ms: int = 500
    log_sample_rate: float = field(
        default=0.01,
        metadata={
            "help": "Share of successful requests logged (request_done); failures always are."
        },
    )
    log_payloads: bool = field(
        default=False,
        metadata={"help": "Put prompts and outputs in request logs (off: never logged)."},
    )
    # Control plane: commands on `control_topic` are applied only when signed with
    # `control_secret` (HMAC-SHA256). A library user opts in; the CLI turns it on.
    control_topic: str | None = field(
        default=None, metadata={"help": "Signed commands; '': off.", "cli": DEFAULT_CONTROL_TOPIC}
    )
    control_secret: str | None = field(
        default=None,
        repr=False,
        metadata={
            "help": "Shared HMAC secret of control commands (unset: every command is refused)."
        },
    )
    models_dir: str | None = field(
        default=None,  # None: no swaps from a path (the CLI gives the model cache)
        metadata={"help": "Swaps may load only from here (default: the model cache)."},
    )
    # Cancellation: `CancelRequest`s on this topic stop requests wherever this worker holds
    # them (every worker reads it, in a group of its own). None: no cancel reader.
    cancel_topic: str | None = field(
        default=None, metadata={"help": "Cancel records; '': off.", "cli": DEFAULT_CANCEL_TOPIC}
    )
    swap_memory_budget_bytes: int | None = field(
        default=None,
        metadata={
            "help": "Bytes all loaded models + KV may use; below it a swap drains first "
            "(default: free device memory decides).",
            "old": "swap_memory_budget",
        },
    )
    keep_previous_model: bool = field(
        default=True,
        metadata={"help": "Keep the old model loaded after a swap so rollback is a flip."},
    )
    http_host: str = field(default="0.0.0.0", metadata={"help": "Address the HTTP server binds."})
    http_port: int | None = field(
        default=None,  # None: no HTTP server
        metadata={"help": "/healthz, /readyz, /metrics; -1: off.", "cli": 9464, "off": -1},
    )
    max_restarts: int = field(
        default=5, metadata={"help": "Crashes of one actor per window, then drain and exit 1."}
    )
    restart_window_s: float = field(
        default=60.0, metadata={"help": "The window's seconds.", "old": "restart_window"}
    )
    max_attempts: int = field(
        default=DEFAULT_MAX_ATTEMPTS,
        metadata={
            "help": "Attempts of a request that fails for a transient reason (engine_error, "
            "shutting_down) before it is dead-lettered; each retry goes through "
            "`<requests topic>.retry.<N>` (created by `tokenmill topics create`). 1: no retries."
        },
    )
    retry_backoff_ms: float = field(
        default=1000.0,
        metadata={
            "help": "How long the first retry waits before it runs; each further one waits "
            "twice the one before."
        },
    )
    max_record_crashes: int = field(
        default=3,
        metadata={
            "help": "Workers that may die in a row with a record in flight before it is "
            "quarantined (answered `quarantined`, sent to the DLQ, never run again)."
        },
    )
    streaming: StreamPolicy = field(
        default_factory=StreamPolicy,
        metadata={
            "prefix": "stream_",
            "parts": {
                "interval_tokens": {
                    "help": "Streamed requests naming none: a chunk after this many new tokens..."
                },
                "interval_ms": {
                    "help": "...or this long after the previous chunk, whichever comes first."
                },
                "min_interval_ms": {
                    "help": "No two chunks of one request closer than this, whatever it asks."
                },
            },
        },
    )
    # Guards (actors/guards): a hung engine step; a resident set grown past a limit.
    watchdog_floor_s: float = field(
        default=step_progress.FLOOR_S,
        metadata={
            "help": "An engine step running longer than this and than --watchdog-step-multiple "
            "× the slowest of the last 256 steps is hung: /healthz 503, leave the group, exit 1."
        },
    )
    watchdog_step_multiple: float = field(
        default=step_progress.MULTIPLE, metadata={"help": "See --watchdog-floor-s."}
    )
    max_rss: int | None = field(
        default=None,
        metadata={
            "help": "Resident memory in bytes past which the worker drains and exits 0, for a "
            "planned restart [default: no limit].",
        },
    )

    @property
    def producer_max_bytes(self) -> int:
        """The producer's `max_request_size`: results and dead letters up to this are sent."""
        if self.max_message_bytes is not None:
            return self.max_message_bytes
        return max(DEFAULT_MAX_MESSAGE_BYTES, self.max_request_bytes + DEAD_LETTER_ROOM)

    @property
    def retry_topics(self) -> tuple[str, ...]:
        """The retry topics the ingest reads and the emitter writes: one per retry."""
        return tuple(retry_topic(self.requests_topic, n) for n in range(1, self.max_attempts))

    def __post_init__(self) -> None:
        positive = {
            "max_request_bytes": self.max_request_bytes,
            "fetch_max_records": self.fetch_max_records,
            "commit_interval_s": self.commit_interval_s,
            "shutdown_timeout_s": self.shutdown_timeout_s,
            "handoff_timeout_s": self.handoff_timeout_s,
            "max_batch_tokens": self.max_batch_tokens,
            "max_batch_size": self.max_batch_size,
            "emit_max_in_flight": self.emit_max_in_flight,
            "max_record_crashes": self.max_record_crashes,
            "max_attempts": self.max_attempts,
            "delivery_timeout_ms": self.delivery_timeout_ms,
            "topic_metadata_wait_ms": self.topic_metadata_wait_ms,
            "transaction_interval_ms": self.transaction_interval_ms,
            "transaction_timeout_ms": self.transaction_timeout_ms,
        }
        for name, value in positive.items():
            if value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        guards = {
            "watchdog_floor_s": self.watchdog_floor_s,
            "watchdog_step_multiple": self.watchdog_step_multiple,
            "max_rss": 1 if self.max_rss is None else self.max_rss,  # None: no limit
        }
        for name, value in guards.items():
            if value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        if not 0.0 <= self.log_sample_rate <= 1.0:
            raise ValueError(f"log_sample_rate must be within [0, 1], got {self.log_sample_rate}")
        if self.retry_backoff_ms < 0:
            raise ValueError(f"retry_backoff_ms must be ≥ 0, got {self.retry_backoff_ms}")
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
