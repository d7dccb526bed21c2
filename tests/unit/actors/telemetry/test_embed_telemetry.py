"""An embedding request's trace and metrics: its process span says `embeddings`, an `embed`
span replaces prefill and decode, and the vectors and tokens it made are counted."""

from __future__ import annotations

from actors.mail import Outcome, RecordRef
from actors.telemetry.metrics import WorkerMetrics
from actors.telemetry.trace_context import TraceContext
from messages.embedding import Embedding, EmbedRequest, EmbedResult, EmbedUsage
from messages.error_codes import ErrorCode
from messages.result import ErrorInfo, ModelRef, Timings
from tests.unit.actors.telemetry.test_metrics import scrape, value
from tests.unit.actors.telemetry.test_tracing import NOW, PARENT, recorded


def result(*, error: ErrorInfo | None = None, inputs: int = 3) -> EmbedResult:
    return EmbedResult(
        id="e-1",
        data=[] if error else [Embedding(index=i, embedding=[1.0, 0.0]) for i in range(inputs)],
        dimensions=0 if error else 2,
        truncated=1,
        usage=EmbedUsage(prompt_tokens=21, total_tokens=21),
        model=ModelRef(name="embeddinggemma-300m", digest="sha256:cd", task="embed"),
        timings=Timings(queued_ms=1.0, total_ms=10.0),
        error=error,
    )


def outcome(res: EmbedResult, *, admitted: bool = True) -> Outcome:
    return Outcome(
        record=RecordRef(topic="reqs", partition=0, offset=3, timestamp_ms=0, key=b"e-1"),
        result=res,
        reply_topic="res",
        content_type="application/json",
        trace=TraceContext.of([("traceparent", PARENT)]),
        admitted=admitted,
        request=EmbedRequest(id="e-1", input=["a", "b", "c"], encoding_format="base64",
                             prompt_name="query", model="embeddinggemma-300m"),
        finished_ns=NOW - 2_000_000,
    )  # fmt: skip


def test_an_embedding_request_has_an_embed_span_in_place_of_prefill_and_decode() -> None:
    spans, _ = recorded(outcome(result()))
    assert set(spans) == {"process reqs", "queue", "embed", "send res"}
    process, embed = spans["process reqs"], spans["embed"]
    assert embed.parent.span_id == process.context.span_id
    consumed = NOW - 12_000_000
    assert (embed.start_time, embed.end_time) == (consumed + 1_000_000, NOW - 2_000_000)
    assert embed.attributes["gen_ai.operation.name"] == "embeddings"
    assert embed.attributes["gen_ai.usage.input_tokens"] == 21
    attributes = process.attributes
    assert attributes["gen_ai.operation.name"] == "embeddings"
    assert attributes["gen_ai.usage.input_tokens"] == 21
    assert "gen_ai.usage.output_tokens" not in attributes
    assert attributes["gen_ai.embeddings.dimension.count"] == 2
    assert attributes["gen_ai.request.encoding_formats"] == ["base64"]
    assert attributes["gen_ai.request.model"] == "embeddinggemma-300m"
    assert attributes["gen_ai.response.model"] == "embeddinggemma-300m"
    assert attributes["gen_ai.response.finish_reasons"] == ["stop"]
    assert attributes["tokenmill.embed.prompt_name"] == "query"
    assert (attributes["tokenmill.embed.inputs"], attributes["tokenmill.embed.truncated"]) == (3, 1)


def test_a_failed_embedding_request_has_no_embed_span() -> None:
    late = ErrorInfo(code=ErrorCode.DEADLINE_EXCEEDED, message="late")
    spans, _ = recorded(outcome(result(error=late)))
    assert set(spans) == {"process reqs", "queue", "send res"}
    assert spans["process reqs"].attributes["gen_ai.response.finish_reasons"] == ["deadline"]
    assert spans["process reqs"].attributes["error.type"] == "deadline_exceeded"


def test_vectors_and_tokens_are_counted_and_requests_by_outcome() -> None:
    metrics = WorkerMetrics()
    metrics.observe_outcome(result(inputs=3), admitted=True)
    metrics.observe_outcome(result(inputs=2), admitted=True)
    cancelled = ErrorInfo(code=ErrorCode.CANCELLED, message="cancelled")
    metrics.observe_outcome(result(error=cancelled), admitted=True)
    unsupported = ErrorInfo(code=ErrorCode.UNSUPPORTED_TASK, message="no")
    metrics.observe_outcome(result(error=unsupported), admitted=False)
    samples = scrape(metrics)
    assert value(samples, "tokenmill_embeddings_total") == 5
    assert value(samples, "tokenmill_embedded_tokens_total") == 42
    assert value(samples, "tokenmill_generated_tokens_total") == 0
    assert value(samples, "tokenmill_requests_total", outcome="stop", code="") == 2
    assert value(samples, "tokenmill_requests_total", outcome="cancelled", code="cancelled") == 1
    assert value(samples, "tokenmill_requests_total", outcome="error",
                 code="unsupported_task") == 1  # fmt: skip
