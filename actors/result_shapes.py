"""A request's result as the wire carries it, of the request's kind: a `GenerateResult` or an
`EmbedResult`.

    result = completed_result(request, completion, stamp, truncated=0)  # the engine ran it
    result = error_result("embed", stamp, reason="cancelled")           # it never ran

A run's result is its `Completion`, the engine's one value for it, mapped whole (text, tokens,
finish reason, usage, logprobs, choices; an embedding request's vectors). What every result
carries whatever its kind (id, model, timings, worker, error, source, metadata) travels as one
`Stamp`; a result that cannot be delivered keeps only its `stripped` part.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from messages.embedding import Embedding, EmbedRequest, EmbedResult, EmbedUsage, EncodingFormat
from messages.error_codes import ErrorCode
from messages.request_kinds import Request, RequestKind, Result
from messages.result import (
    Choice,
    ErrorInfo,
    FinishReason,
    GenerateResult,
    ModelRef,
    SourceRef,
    Timings,
    TokenLogprobs,
    Usage,
)

if TYPE_CHECKING:  # only read here; gpu.logprobs imports torch, which the ingest needs not
    from gpu.engine_io import Completion
    from gpu.logprobs import CompletionLogprobs

_FINISH = {
    "stop": FinishReason.STOP,
    "length": FinishReason.LENGTH,
    "cancelled": FinishReason.CANCELLED,
    "deadline": FinishReason.DEADLINE,
    "shutting_down": FinishReason.ERROR,
    "error": FinishReason.ERROR,
}

# An embedding result has no finish reason: one cancelled says so in its error.
CANCELLED = ErrorInfo(code=ErrorCode.CANCELLED, message="the request was cancelled")
_EMBED_FINISH = {
    ErrorCode.CANCELLED: FinishReason.CANCELLED,
    ErrorCode.DEADLINE_EXCEEDED: FinishReason.DEADLINE,
}


@dataclass(frozen=True, slots=True)
class Stamp:
    """What every result carries, whatever its kind."""

    id: str
    worker: str
    source: SourceRef | None
    model: ModelRef | None = None
    timings: Timings = field(default_factory=Timings)
    error: ErrorInfo | None = None
    metadata: dict[str, str] = field(default_factory=dict)

    def fields(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "worker": self.worker,
            "source": self.source,
            "model": self.model,
            "timings": self.timings,
            "error": self.error,
            "metadata": self.metadata,
        }


def finish_reason(engine_reason: str) -> FinishReason:
    return _FINISH.get(engine_reason, FinishReason.ERROR)


def finish_of(result: Result) -> FinishReason:
    """Why `result`'s request ended, for metrics, spans and logs: its finish reason; an
    embedding result's from its error (none: `stop`)."""
    if isinstance(result, GenerateResult):
        return result.finish_reason
    if result.error is None:
        return FinishReason.STOP
    return _EMBED_FINISH.get(result.error.code, FinishReason.ERROR)


def completed_result(
    request: Request, completion: Completion, stamp: Stamp, *, truncated: int = 0
) -> Result:
    """The result of a request the engine ran (finished, or aborted there with
    `stamp.error`). `truncated`: an embedding request's inputs cut to fit the model."""
    if isinstance(request, EmbedRequest):
        return _embed_result(completion, stamp, request.encoding_format, truncated)
    return GenerateResult(
        text=completion.text,
        token_ids=completion.token_ids,
        finish_reason=finish_reason(completion.finish_reason),
        usage=wire_usage(completion),
        logprobs=wire_logprobs(completion.logprobs),
        choices=wire_choices(completion),
        prompt_logprobs=wire_logprobs(completion.prompt_logprobs),
        prompt_text=completion.prompt_text,
        **stamp.fields(),
    )


def error_result(
    kind: RequestKind, stamp: Stamp, *, reason: str = "error", prompt_tokens: int = 0
) -> Result:
    """The result of a request answered without a run (refused, cancelled, failed): no
    output; `reason` the engine's word for why (`finish_reason`); `prompt_tokens` as the
    ingest counted them, if it did."""
    if kind == "embed":
        error = stamp.error
        if error is None and reason == "cancelled":
            error = CANCELLED
        usage = EmbedUsage(prompt_tokens=prompt_tokens, total_tokens=prompt_tokens)
        return EmbedResult(usage=usage, **{**stamp.fields(), "error": error})
    return GenerateResult(
        finish_reason=finish_reason(reason),
        usage=Usage(prompt_tokens=prompt_tokens, total_tokens=prompt_tokens),
        **stamp.fields(),
    )


def stripped(result: Result, error: ErrorInfo) -> Result:
    """`result` answered with `error` instead: only its id, usage, model, timings, worker and
    source kept (so it always fits where its result did not)."""
    kept = ("id", "usage", "model", "timings", "worker", "source")
    return type(result)(error=error, **{name: getattr(result, name) for name in kept})


def _embed_result(
    completion: Completion, stamp: Stamp, encoding: EncodingFormat, truncated: int
) -> EmbedResult:
    """An embedding request's vectors, in input order (none when it was aborted); its timings
    are the stamp's queued and total (no token timings)."""
    vectors = () if stamp.error is not None else completion.embeddings
    timings = Timings(queued_ms=stamp.timings.queued_ms, total_ms=stamp.timings.total_ms)
    tokens = completion.prompt_tokens
    data = [Embedding(index=i, embedding=wire_vector(v, encoding)) for i, v in enumerate(vectors)]
    return EmbedResult(
        data=data,
        dimensions=len(vectors[0]) if vectors else 0,
        truncated=truncated,
        usage=EmbedUsage(prompt_tokens=tokens, total_tokens=tokens),
        **{**stamp.fields(), "timings": timings},
    )


def wire_vector(vector: Any, encoding: EncodingFormat) -> list[float] | str:
    """One vector as the result carries it: its float32 values as numbers, or (base64) their
    little-endian bytes base64-encoded, as OpenAI's API sends them."""
    values = np.asarray(vector, dtype="<f4")
    if encoding == "base64":
        return base64.b64encode(values.tobytes()).decode("ascii")
    return values.tolist()  # type: ignore[no-any-return]


def wire_logprobs(logprobs: CompletionLogprobs | None) -> TokenLogprobs | None:
    """A completion's logprobs as the result carries them."""
    if logprobs is None:
        return None
    return TokenLogprobs(
        tokens=logprobs.tokens,
        token_logprobs=logprobs.token_logprobs,
        top_ids=logprobs.top_ids,
        top_logprobs=logprobs.top_logprobs,
        top_tokens=logprobs.top_tokens,
        unscored_first=logprobs.unscored_first,
        token_ids=logprobs.token_ids,
    )


def wire_choices(completion: Completion) -> list[Choice]:
    """A completion's choices (n > 1) as the result carries them; none for one choice."""
    return [
        Choice(
            index=i,
            text=choice.text,
            token_ids=choice.token_ids,
            finish_reason=finish_reason(choice.finish_reason),
            logprobs=wire_logprobs(choice.logprobs),
        )
        for i, choice in enumerate(completion.choices)
    ]


def wire_usage(completion: Completion) -> Usage:
    """A completion's token counts as the result carries them: every choice's new tokens, and
    its speculation's guesses split into accepted and rejected."""
    if completion.choices:
        completion_tokens = sum(len(c.token_ids) for c in completion.choices)
    else:
        completion_tokens = len(completion.token_ids)
    accepted = completion.accepted_draft_tokens
    return Usage(
        prompt_tokens=completion.prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=completion.prompt_tokens + completion_tokens,
        cached_tokens=completion.cached_tokens,
        accepted_draft_tokens=accepted,
        rejected_draft_tokens=max(0, completion.draft_tokens - accepted),
    )
