"""`GenerateResult`: what the worker puts on the reply topic, one per request record."""

from __future__ import annotations

import enum

import msgspec

from messages.error_codes import ErrorCode
from messages.request import SCHEMA_VERSION


class FinishReason(enum.StrEnum):
    STOP = "stop"  # end of sequence, a stop token or a stop string
    LENGTH = "length"  # max_new_tokens reached
    DEADLINE = "deadline"  # aborted at its deadline (the error says deadline_exceeded)
    CANCELLED = "cancelled"
    ERROR = "error"  # see `error`


class Usage(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    """Token counts. `cached_tokens`: of the prompt tokens, those whose K/V the prefix cache
    served (they were not computed again)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    cached_tokens: int = 0


class ModelRef(msgspec.Struct, kw_only=True, forbid_unknown_fields=False, omit_defaults=True):
    name: str
    digest: str  # content hash of the weights
    quantization: str = "none"  # how its linear weights are held: int8, int4-g32, mixes, none


class Timings(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    """Milliseconds. `queued`: consumed → admitted to the engine; `total`: consumed → result."""

    queued_ms: float = 0.0
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    total_ms: float = 0.0


class ErrorInfo(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    code: ErrorCode
    message: str


class SourceRef(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    """Where the request record was read: lets a client correlate a result whose id is lost."""

    topic: str
    partition: int
    offset: int


class GenerateResult(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    """The answer to one request record: text and tokens, or `error` with a closed code.

    `id` is the request's; when the record could not be decoded it is the record key (or "").
    """

    v: int = SCHEMA_VERSION
    id: str
    text: str = ""
    token_ids: list[int] = msgspec.field(default_factory=list)
    finish_reason: FinishReason = FinishReason.ERROR
    usage: Usage = msgspec.field(default_factory=Usage)
    model: ModelRef | None = None
    timings: Timings = msgspec.field(default_factory=Timings)
    worker: str = ""
    error: ErrorInfo | None = None
    source: SourceRef | None = None
    metadata: dict[str, str] = msgspec.field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.error is None
