"""An embedding request's records: its `EmbedResult` under its own schema header, its retry
marked `EmbedRequest/1`, its result answered instead (too large) as an `EmbedResult`."""

from __future__ import annotations

from typing import Any, cast

from actors.emit.planning import OutcomePlanner
from actors.emit.records import Pending
from actors.mail import Outcome
from messages import headers as h
from messages.codec import JSON, MSGPACK, Codec
from messages.embedding import Embedding, EmbedRequest, EmbedResult
from messages.error_codes import ErrorCode
from messages.request_kinds import request_kind
from messages.result import ErrorInfo
from tests.unit.actors.emit.test_planning import CONFIG, RECORD, TRACE

results = Codec(EmbedResult)


def pending(result: EmbedResult, content_type: str = JSON) -> Pending:
    outcome = Outcome(
        record=RECORD,
        result=result,
        reply_topic="lane.replies",
        content_type=content_type,
        request=EmbedRequest(id=result.id, input=["a", "b"]),
        admitted=True,
    )
    spans: Any = type("Spans", (), {"headers": TRACE})()
    return Pending(outcome, cast(Any, spans), [], [])


def vectors(width: int, count: int = 2) -> list[Embedding]:
    return [Embedding(index=i, embedding=[0.125] * width) for i in range(count)]


def test_an_embed_result_is_sent_under_its_schema_in_the_requests_format() -> None:
    for content_type in (JSON, MSGPACK):
        p = pending(EmbedResult(id="e-1", data=vectors(4), dimensions=4), content_type)
        OutcomePlanner(count=lambda _: None).plan(p, CONFIG)
        [record] = p.records
        assert h.header(record.headers, h.SCHEMA) == h.EMBED_RESULT_SCHEMA.encode()
        assert record.key == b"e-1"
        assert results.decode(record.value, content_type).data == vectors(4)


def test_an_embed_result_too_large_is_answered_with_an_embed_error_result() -> None:
    p = pending(EmbedResult(id="e-1", data=vectors(CONFIG.producer_max_bytes // 4), dimensions=9))
    OutcomePlanner(count=lambda _: None).plan(p, CONFIG)
    result, letter = p.records
    assert h.header(result.headers, h.SCHEMA) == h.EMBED_RESULT_SCHEMA.encode()
    answer = results.decode(result.value, JSON)
    assert answer.error is not None and answer.error.code is ErrorCode.RESULT_TOO_LARGE
    assert answer.data == [] and letter.topic == CONFIG.dlq_topic


def test_a_retried_embed_request_says_its_kind() -> None:
    error = ErrorInfo(code=ErrorCode.ENGINE_ERROR, message="boom")
    p = pending(EmbedResult(id="e-1", error=error))
    OutcomePlanner(count=lambda _: None, retries_usable=True).plan(p, CONFIG)
    [retry] = p.records
    assert retry.is_retry
    schema = h.header(retry.headers, h.SCHEMA)
    assert schema == h.EMBED_REQUEST_SCHEMA.encode()
    assert request_kind(retry.value, JSON, schema) == request_kind(retry.value, JSON, None)
    assert Codec(EmbedRequest).decode(retry.value, JSON).input == ["a", "b"]
