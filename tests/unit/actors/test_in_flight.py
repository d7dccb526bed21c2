"""engine_request: what the engine runs for an admitted request, its constraint included."""

from __future__ import annotations

from typing import Any

import pytest

from actors.in_flight import engine_request
from actors.mail import Admitted, RecordRef
from actors.telemetry.trace_context import TraceContext
from gpu.sequence import Constraint
from messages.request import GenerateRequest
from messages.response_format import JsonSchemaFormat, ResponseFormat
from messages.structured_output import StructuredOutput


def admitted(request: GenerateRequest) -> Admitted:
    return Admitted(
        request=request,
        record=RecordRef("requests", 0, 7, 0),
        prompt_token_ids=[5, 6, 7],
        reply_topic="results",
        content_type="application/json",
        trace=TraceContext(),
        consumed_at=1.0,
        deadline=None,
    )


SCHEMA = ResponseFormat(
    type="json_schema", json_schema=JsonSchemaFormat(schema={"type": "integer"}, strict=True)
)


RULES = {
    "regex": (StructuredOutput(regex="[a-z]+"), Constraint("regex", "[a-z]+")),
    "choice": (StructuredOutput(choice=["a", "b"]), Constraint("choice", '["a", "b"]')),
    "grammar": (StructuredOutput(grammar='start: "x"'), Constraint("grammar", 'start: "x"')),
}
CASES: list[tuple[dict[str, Any], Constraint | None]] = [
    ({}, None),
    ({"response_format": ResponseFormat(type="text")}, None),
    ({"response_format": SCHEMA}, Constraint("json", '{"type":"integer"}', strict=True)),
    ({"response_format": ResponseFormat(type="json_object")}, Constraint.json('{"type":"object"}')),
    *(({"structured_output": given}, expected) for given, expected in RULES.values()),
]


@pytest.mark.parametrize(("fields", "constraint"), CASES)
def test_the_request_s_constraint_reaches_the_engine(
    fields: dict[str, Any], constraint: Constraint | None
) -> None:
    request = GenerateRequest(id="r1", prompt="Hi", **fields)
    runs = engine_request(admitted(request), [5, 6, 7])
    assert runs.params.constraint == constraint
    assert runs.request_id == "r1" and list(runs.prompt_token_ids) == [5, 6, 7]


def test_prompt_logprobs_and_a_scoring_length_reach_the_engine() -> None:
    request = GenerateRequest(id="r1", prompt="Hi", max_new_tokens=0, prompt_logprobs=3)
    runs = engine_request(admitted(request), [5, 6, 7])
    assert (runs.params.prompt_logprobs, runs.params.max_new_tokens) == (3, 0)
    assert (
        engine_request(admitted(GenerateRequest(id="r2", prompt="Hi")), [5]).params.prompt_logprobs
        is None
    )


def test_a_requests_speculation_opt_out_reaches_the_engine() -> None:
    assert engine_request(admitted(GenerateRequest(id="r1", prompt="Hi")), [5]).params.speculate
    opted_out = GenerateRequest(id="r2", prompt="Hi", speculate=False)
    assert not engine_request(admitted(opted_out), [5]).params.speculate
