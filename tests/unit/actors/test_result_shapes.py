"""An embedding request's result beside a generation request's: vectors in input order, as
floats or OpenAI's base64, from the one `Completion`; errors of the request's kind."""

from __future__ import annotations

import base64
import time
from typing import Any

import msgspec
import numpy as np
import pytest

from actors.ingest.model_front import EmbedInputs
from actors.mail import Admitted, RecordRef
from actors.result_shapes import Stamp, error_result, finish_of, stripped, wire_vector
from actors.results import engine_outcome, rejected_at_door, undeliverable, unrun_outcome
from actors.telemetry.trace_context import TraceContext
from gpu.engine_io import Completion
from messages.embedding import EmbedRequest, EmbedResult
from messages.error_codes import ErrorCode
from messages.result import ErrorInfo, FinishReason, GenerateResult, ModelRef, SourceRef, Timings

MODEL = ModelRef(name="fake-embed", digest="sha256:cd", task="embed")
RECORD = RecordRef("requests", 2, 40, 0, key=b"k")
VECTORS = (
    np.array([0.6, 0.8, 0.0], dtype=np.float32),
    np.array([0.0, 0.28, 0.96], dtype=np.float32),
)


def item(request: EmbedRequest, inputs: tuple[list[int], ...], truncated: int = 0) -> Admitted:
    embed = EmbedInputs(inputs, truncated)
    return Admitted(
        request=request,
        record=RECORD,
        prompt_token_ids=embed.tokens,
        reply_topic="results",
        content_type="application/json",
        trace=TraceContext(),
        consumed_at=time.monotonic() - 0.5,
        deadline=None,
        embed=embed,
    )


def completion(reason: str = "stop", vectors: tuple[Any, ...] = VECTORS) -> Completion:
    now = time.monotonic()
    return Completion(
        request_id="e1", prompt_tokens=7, token_ids=[], text="", finish_reason=reason,
        arrival_time=now - 0.2, first_token_time=None, finish_time=now, num_preemptions=0,
        embeddings=vectors,
    )  # fmt: skip


def test_an_embed_run_is_an_embed_result_with_its_vectors_in_input_order() -> None:
    request = EmbedRequest(id="e1", input=["a", "b"], metadata={"k": "v"})
    outcome = engine_outcome(
        item(request, ([2, 5, 1], [2, 6, 7, 1]), truncated=1),
        completion(), model=MODEL, worker="w1", queued_ms=3.0,
    )  # fmt: skip
    result = outcome.result
    assert isinstance(result, EmbedResult) and result.ok
    assert [e.index for e in result.data] == [0, 1]
    assert [e.embedding for e in result.data] == [v.tolist() for v in VECTORS]
    assert (result.dimensions, result.truncated) == (3, 1)
    assert (result.usage.prompt_tokens, result.usage.total_tokens) == (7, 7)
    assert result.model == MODEL and result.worker == "w1" and result.metadata == {"k": "v"}
    assert result.source == SourceRef(topic="requests", partition=2, offset=40)
    assert result.timings.queued_ms == 3.0 and result.timings.total_ms >= 500
    assert result.timings.ttft_ms is None and result.timings.tpot_ms is None
    assert outcome.admitted and outcome.cost_tokens == 7 and outcome.request is request


def test_float_vectors_are_the_float32_values_exactly() -> None:
    v = np.array([0.1, -1 / 3, 2e-8], dtype=np.float32)
    floats = wire_vector(v, "float")
    assert isinstance(floats, list)
    assert np.array_equal(np.array(floats, dtype=np.float32), v)
    decoded = msgspec.json.decode(msgspec.json.encode(floats))
    assert np.array_equal(np.array(decoded, dtype=np.float32), v)


def test_base64_is_the_little_endian_float32_bytes_as_openai_sends_them() -> None:
    v = np.array([0.1, -1 / 3, 2e-8], dtype=np.float32)
    text = wire_vector(v, "base64")
    assert isinstance(text, str)
    assert np.array_equal(np.frombuffer(base64.b64decode(text), dtype="<f4"), v)
    request = EmbedRequest(id="e1", input=["a", "b"], encoding_format="base64")
    result = engine_outcome(
        item(request, ([2, 1], [2, 1])), completion(), model=MODEL, worker="w", queued_ms=0
    ).result
    assert isinstance(result, EmbedResult)
    decoded = [np.frombuffer(base64.b64decode(str(e.embedding)), "<f4") for e in result.data]
    assert all(np.array_equal(a, b) for a, b in zip(decoded, VECTORS, strict=True))


def test_an_aborted_embed_run_carries_its_error_and_no_vectors() -> None:
    request = EmbedRequest(id="e1", input="a")
    deadline = ErrorInfo(code=ErrorCode.DEADLINE_EXCEEDED, message="late")
    result = engine_outcome(
        item(request, ([2, 1],)), completion("deadline", ()), model=MODEL, worker="w",
        queued_ms=0, error=deadline,
    ).result  # fmt: skip
    assert isinstance(result, EmbedResult)
    assert result.error == deadline and result.data == [] and result.dimensions == 0
    assert finish_of(result) is FinishReason.DEADLINE


def test_an_embed_request_answered_without_a_run() -> None:
    request = EmbedRequest(id="e1", input="a", metadata={"k": "v"})
    failed = unrun_outcome(
        item(request, ([2, 5, 1],)), "error", model=MODEL, worker="w",
        error=ErrorInfo(code=ErrorCode.SHUTTING_DOWN, message="bye"),
    ).result  # fmt: skip
    assert isinstance(failed, EmbedResult)
    assert failed.error is not None and failed.error.code is ErrorCode.SHUTTING_DOWN
    assert failed.usage.prompt_tokens == 3 and failed.metadata == {"k": "v"}
    cancelled = unrun_outcome(item(request, ([2, 1],)), "cancelled", model=MODEL, worker="w")
    assert isinstance(cancelled.result, EmbedResult)
    assert cancelled.result.error is not None
    assert cancelled.result.error.code is ErrorCode.CANCELLED
    assert finish_of(cancelled.result) is FinishReason.CANCELLED


def test_a_refusal_at_the_door_is_of_the_requests_kind() -> None:
    def refuse(**kw: Any) -> Any:
        return rejected_at_door(
            RECORD, ErrorCode.UNSUPPORTED_TASK, "no", request_id="e1", reply_topic="results",
            content_type="application/json", worker="w", value=b"{}", headers=[],
            trace=TraceContext(), **kw,
        ).result  # fmt: skip

    assert isinstance(refuse(request=EmbedRequest(id="e1", input="a")), EmbedResult)
    assert isinstance(refuse(kind="embed"), EmbedResult)
    assert isinstance(refuse(), GenerateResult)
    result = refuse(kind="embed")
    assert result.error.code is ErrorCode.UNSUPPORTED_TASK and finish_of(result) == "error"


@pytest.mark.parametrize("kind", ["embed", "generate"])
def test_an_undeliverable_result_keeps_only_what_always_fits(kind: Any) -> None:
    stamp = Stamp("e1", "w", RECORD.source(), MODEL, Timings(total_ms=5.0), None, {"k": "v"})
    result = error_result(kind, stamp, prompt_tokens=4)
    answered = stripped(result, ErrorInfo(code=ErrorCode.RESULT_TOO_LARGE, message="big"))
    assert type(answered) is type(result)
    assert (answered.id, answered.usage, answered.model) == ("e1", result.usage, MODEL)
    assert answered.metadata == {} and answered.timings.total_ms == 5.0
    assert answered.error is not None and answered.error.code is ErrorCode.RESULT_TOO_LARGE


def test_undeliverable_answers_an_embed_result_with_an_embed_result() -> None:
    request = EmbedRequest(id="e1", input=["a", "b"])
    outcome = engine_outcome(
        item(request, ([2, 1], [2, 1])), completion(), model=MODEL, worker="w", queued_ms=0
    )
    instead = undeliverable(
        outcome, ErrorCode.RESULT_TOO_LARGE, "too big", results_topic="results", value=b"{}"
    )
    assert isinstance(instead.result, EmbedResult)
    assert instead.result.data == [] and instead.result.usage.prompt_tokens == 7
    assert instead.dead_letter is not None
