"""An outcome's records: its result within the producer's limit, else an error result on the
results topic and the request to the DLQ (`result_too_large`)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from actors.config import DEAD_LETTER_ROOM, WorkerConfig
from actors.emit.planning import OutcomePlanner
from actors.emit.records import Pending
from actors.mail import Outcome, RecordRef
from messages import headers as h
from messages.codec import JSON, Codec
from messages.error_codes import ErrorCode
from messages.limits import MAX_KEY_BYTES
from messages.request import GenerateRequest
from messages.result import GenerateResult

RECORD = RecordRef("lane.requests", 0, 17, 0, key=b"record-key")
CONFIG = WorkerConfig(
    results_topic="lane.results",
    dlq_topic="lane.dlq",
    max_request_bytes=4096,
    max_message_bytes=4096 + DEAD_LETTER_ROOM,
)
TRACE = [(h.TRACEPARENT, b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")]


def pending(text: str, request_id: str = "r-1") -> Pending:
    request = GenerateRequest(id=request_id, prompt_token_ids=[5], max_new_tokens=2)
    outcome = Outcome(
        record=RECORD,
        result=GenerateResult(id=request_id, text=text, metadata={"team": "search"}),
        reply_topic="lane.replies",
        content_type=JSON,
        request=request,
    )
    spans = SimpleNamespace(headers=TRACE)  # the request's spans: only their headers are read
    return Pending(outcome, cast(Any, spans), [], [])


def planner() -> tuple[OutcomePlanner, list[str]]:
    counted: list[str] = []
    return OutcomePlanner(count=counted.append), counted


def test_a_result_within_the_limit_is_one_record_keyed_by_its_id() -> None:
    plan, counted = planner()
    p = pending("hello")
    plan.plan(p, CONFIG)
    [result] = p.records
    assert (result.topic, result.key, result.is_result) == ("lane.replies", b"r-1", True)
    assert list(result.headers) == [
        *TRACE,
        (h.CONTENT_TYPE, JSON.encode()),
        (h.SCHEMA, h.RESULT_SCHEMA.encode()),
    ]
    assert Codec(GenerateResult).decode(result.value, JSON).text == "hello"
    assert p.answered is None and plan.answered_instead == 0 and counted == []


def test_a_result_over_the_producers_limit_is_answered_with_an_error_and_a_dead_letter() -> None:
    plan, counted = planner()
    p = pending("x" * (CONFIG.producer_max_bytes + 1))
    plan.plan(p, CONFIG)
    result, letter = p.records
    assert p.answered is ErrorCode.RESULT_TOO_LARGE
    assert result.topic == "lane.results" and result.size <= CONFIG.producer_max_bytes
    answer = Codec(GenerateResult).decode(result.value, JSON)
    assert answer.id == "r-1" and answer.error is not None
    assert answer.error.code is ErrorCode.RESULT_TOO_LARGE
    assert answer.text == "" and answer.metadata == {}, "small by construction"
    assert (letter.topic, letter.is_result) == ("lane.dlq", False)
    request = Codec(GenerateRequest).decode(letter.value, JSON)
    assert request.id == "r-1", "the dead letter carries the request"
    assert plan.answered_instead == 1 and counted == ["answered"]


def test_an_answer_is_planned_once_even_if_it_is_still_too_large() -> None:
    plan, _ = planner()
    p = pending("small")
    p.answered = ErrorCode.REPLY_TO_REFUSED  # answered already: never answered twice
    plan.plan(p, CONFIG)
    assert [r.topic for r in p.records] == ["lane.replies"]


def test_a_key_over_the_kafka_key_limit_is_left_out() -> None:
    plan, _ = planner()
    p = pending("hello", request_id="k" * (MAX_KEY_BYTES + 1))
    plan.plan(p, CONFIG)
    assert p.records[0].key is None


def test_a_result_without_an_id_is_keyed_by_its_records_key() -> None:
    plan, _ = planner()
    p = pending("hello", request_id="")
    plan.plan(p, CONFIG)
    assert p.records[0].key == b"record-key"
