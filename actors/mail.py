"""The typed messages actors send each other (in-process only; never on the wire).

    IngestActor ──Batch──► GpuActor ──Outcome──► EmitterActor ──Delivered──► IngestActor
         │                          └─StreamChunk─┘ (streamed requests, before their Outcome)
         └──────────────── Outcome (rejected at the door) ──────┘

With `--exactly-once`, the ingest also tells the emitter which partitions it takes over
(`TakeOver`, then `LaneStart` with each one's last commit) and what to commit
(`CommitOffsets`): the emitter writes results and offsets in one transaction per partition.
An outcome it cannot answer (its partition handed off or fenced) comes back as `Dropped`.

An outcome whose dead letter the DLQ refuses is announced to the ingest first
(`OutcomeBlocked`), its `Delivered` coming once the DLQ takes the letter; so is one that waits
for its reply topic (`OutcomeWaiting`), its `Delivered` coming once sent or answered instead.

A record's `RecordRef` travels with it end to end, so the ingest can mark its offset done
once the emitter reports the result delivered.

This module imports no actor and none of their helpers: only the wire types of `messages/`
and the value types messages carry (a `ModelFront`, a `SpanLink`, a `TraceContext`), which
import no actor either (`tests/unit/test_layering.py` checks it).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from aiokafka.structs import TopicPartition

from actors.ingest.model_front import EmbedInputs, ModelFront
from actors.telemetry.span_link import SpanLink
from actors.telemetry.trace_context import TraceContext
from actors.transactions.answered import AnsweredOffsets
from messages.attempts import Attempts
from messages.chunk import GenerateChunk
from messages.control import Command
from messages.headers import Headers
from messages.request import GenerateRequest
from messages.request_kinds import Request, Result
from messages.result import SourceRef

# Why a batch was cut: a length bucket filled (tokens, size), waited long enough (wait), the
# ingest went idle or drained; requeued: after a GPU actor crash; isolated: run alone after a
# worker died with it (see actors.ingest.crash_guard).
FlushReason = Literal["tokens", "size", "wait", "idle", "drain", "requeued", "isolated"]


# Where a cancel record found the request it stopped: in a length bucket (ingest), queued for
# the engine (GPU actor), or in the engine (waiting, prefilling or decoding).
CancelledIn = Literal["arrival", "bucket", "queue", "engine"]  # arrival: cancelled before it


@dataclass(frozen=True, slots=True)
class RecordRef:
    """Where a request record came from."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None = None

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)

    def source(self) -> SourceRef:
        return SourceRef(topic=self.topic, partition=self.partition, offset=self.offset)


@dataclass(slots=True)
class Admitted:
    """A request that passed every check at the door and is tokenized, ready to run.

    An embedding request's `prompt_token_ids` are its inputs' tokens one after another (what
    it weighs in buckets, budgets and watermarks); `embed` holds them input by input."""

    request: Request
    record: RecordRef
    prompt_token_ids: list[int]
    reply_topic: str
    content_type: str
    trace: TraceContext  # read from the record's headers at the door
    consumed_at: float  # monotonic seconds
    deadline: float | None  # monotonic seconds
    batch_span: SpanLink | None = None  # the span of the batch it ran in, when traced
    model_digest: str = ""  # the model whose tokenizer made `prompt_token_ids`
    attempts: Attempts = field(default_factory=Attempts)  # which attempt its record is
    embed: EmbedInputs | None = None  # an embedding request's inputs, tokenized

    @property
    def cost_tokens(self) -> int:
        """What it may occupy in the engine: prompt plus every token each of its choices may
        generate (the choices share the prompt); an embedding request's inputs."""
        request = self.request
        if isinstance(request, GenerateRequest):
            return len(self.prompt_token_ids) + request.n * request.max_new_tokens
        return len(self.prompt_token_ids)


@dataclass(slots=True)
class Batch:
    """A flushed length bucket: requests of similar prompt length, admitted together."""

    bucket: int
    items: list[Admitted]
    tokens: int
    reason: FlushReason


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """The raw record of a request that could not be decoded, for the DLQ topic."""

    key: bytes | None
    value: bytes | None
    headers: Headers


@dataclass(slots=True)
class Outcome:
    """A finished record: the result to produce and, when undecodable, its dead letter. (One
    that failed for a transient reason before its last attempt becomes, when planned, its
    request for a retry topic instead: `actors.emit.planning`.)"""

    record: RecordRef
    result: Result  # a `GenerateResult`, or an `EmbedResult` for an embedding request
    reply_topic: str
    content_type: str
    trace: TraceContext = field(default_factory=TraceContext)
    cost_tokens: int = 0  # > 0 when it was counted against the backpressure watermarks
    admitted: bool = False  # it went through the engine (counted as outstanding work)
    dead_letter: DeadLetter | None = None
    batch_span: SpanLink | None = None  # linked from the request's process span
    request: Request | None = None  # when it was decoded (for its trace attributes)
    preemptions: int = 0  # times the engine preempted it (KV blocks ran out)
    kv_blocks: int = 0  # KV-cache blocks it held when it finished
    finished_ns: int = field(default_factory=time.time_ns)  # wall clock; timings end here
    cancelled_in: CancelledIn | None = None  # where a cancel record found it
    attempts: Attempts = field(default_factory=Attempts)  # which attempt its record was


@dataclass(frozen=True, slots=True)
class Cancel:
    """Cancel actor → ingest → GPU actor: stop request `request_id` wherever it is held.

    It passes the ingest first, then travels in the same mailbox as the batches, so it always
    comes after a batch that took the request out of its bucket."""

    request_id: str
    reason: str = ""
    answered: bool = False  # the ingest answered it from a bucket (a copy may still run)


@dataclass(frozen=True, slots=True)
class StreamChunk:
    """A streamed request's partial result, for its reply topic (GPU actor → emitter).

    Not an outcome: it marks no offset done. The request's `Outcome` follows its chunks in
    the same mailbox, and the emitter reports it delivered only once its chunks are too.
    """

    chunk: GenerateChunk
    reply_topic: str
    content_type: str
    trace: TraceContext = field(default_factory=TraceContext)


@dataclass(frozen=True, slots=True)
class SwapOrder:
    """Supervisor → GPU actor: swap to the checkpoint at `target` (None: roll back)."""

    target: Path | None
    requested: str  # the name the command used, for events
    command: str | None = None  # the command's nonce, for events


@dataclass(frozen=True, slots=True)
class UseModel:
    """GPU actor → ingest, after a flip: tokenize and check new requests with this model."""

    front: ModelFront


@dataclass(frozen=True, slots=True)
class VerifiedCommand:
    """A control command whose signature, age and nonce were checked (ControlActor → supervisor)."""

    command: Command
    nonce: str


@dataclass(frozen=True, slots=True)
class Delivered:
    """The broker acknowledged an outcome's result: its offset may be committed."""

    record: RecordRef
    admitted: bool
    cost_tokens: int


@dataclass(frozen=True, slots=True)
class OutcomeBlocked:
    """Emitter → ingest: this record's outcome is made but held back, its dead letter refused
    by the DLQ and sent again until taken (then `Delivered` follows). Its offset still stops
    the partition's commits, but a drain does not wait for it: the emitter gives it up at
    its stop, and the record is read again by the partition's next owner."""

    record: RecordRef


@dataclass(frozen=True, slots=True)
class OutcomeWaiting:
    """Emitter → ingest: this record's outcome is made but waits (bounded) for its reply topic,
    which the producer does not know (`actors.emit.destinations`); `Delivered` follows. The
    engine is done with it: the ingest does not count it as running."""

    record: RecordRef


@dataclass(frozen=True, slots=True)
class TakeOver:
    """Ingest → emitter, with `--exactly-once`: these partitions are now this worker's. The
    emitter opens a transactional producer for each, whose id names the partition: that fences
    the last owner's producer and ends its open transaction. `done` resolves (with the
    partitions that could not be opened) before the ingest reads the partitions' commits."""

    partitions: frozenset[TopicPartition]
    done: asyncio.Future[frozenset[TopicPartition]]


@dataclass(frozen=True, slots=True)
class LaneStart:
    """Ingest → emitter, after `TakeOver`: a partition's last commit, read once it was fenced.
    Outcomes below `offset` or in `answered` were answered already."""

    tp: TopicPartition
    offset: int | None
    guard_metadata: str
    answered: AnsweredOffsets


@dataclass(frozen=True, slots=True)
class CommitOffsets:
    """Ingest → emitter, with `--exactly-once`: commit each partition's offset with its
    crash-guard metadata in the partition's next transaction (`release`: then close its lane).
    `done` is False when a partition's lane was fenced (nothing of it was written)."""

    offsets: Mapping[TopicPartition, tuple[int, str]]
    release: bool
    done: asyncio.Future[bool]


@dataclass(frozen=True, slots=True)
class HandOff:
    """Ingest → emitter, with `--exactly-once`: these partitions were revoked; their lanes
    close once a release in progress has committed (what still waits is dropped)."""

    partitions: frozenset[TopicPartition]
    done: asyncio.Future[None]


@dataclass(frozen=True, slots=True)
class LaneLost:
    """Emitter → ingest, with `--exactly-once`: a partition's lane died without being handed
    off (its producer fenced, or broken for good, or its transaction stuck). Nothing more of the
    partition can be answered here until the group assigns it again: if the ingest still holds
    it, it rejoins the group (its next owner, maybe this worker, opens a new lane)."""

    tp: TopicPartition
    reason: str


@dataclass(frozen=True, slots=True)
class Dropped:
    """Emitter → ingest, with `--exactly-once`: an outcome not answered here, its partition
    handed off or fenced; the partition's owner answers the record. It releases the outcome's
    backpressure and marks no offset done."""

    record: RecordRef
    admitted: bool
    cost_tokens: int
