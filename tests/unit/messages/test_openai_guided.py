"""A batch line's constraint: vLLM's structured_outputs and guided_* fields and OpenAI's
response_format become the request's response_format or structured_output; one at most."""

from __future__ import annotations

from typing import Any

import pytest

from messages.error_codes import ErrorCode
from messages.errors import BatchLineRefused
from messages.openai_batch_mapping import LineCode, to_request
from messages.request import GenerateRequest
from messages.response_format import JsonSchemaFormat, ResponseFormat
from messages.structured_output import StructuredOutput
from tests.unit.messages.test_openai_batch_mapping import (
    chat_line,
    completion_line,
    request,
    request_refused,
)

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
AS_SCHEMA = ResponseFormat(
    type="json_schema",
    json_schema=JsonSchemaFormat(name="structured_outputs", schema=SCHEMA, strict=False),
)
REGEX = StructuredOutput(regex="[0-9]{3}")
CHOICE = StructuredOutput(choice=["yes", "no"])
GRAMMAR = StructuredOutput(grammar='start: "a"+')

# Each way a body names a constraint, and what the request carries.
GIVEN: list[tuple[dict[str, Any], dict[str, Any]]] = [
    ({"structured_outputs": {"json": SCHEMA}}, {"response_format": AS_SCHEMA}),
    ({"structured_outputs": {"json": '{"type":"object","properties":{"a":{"type":"integer"}},'
                                     '"required":["a"]}'}}, {"response_format": AS_SCHEMA}),
    ({"structured_outputs": {"json_object": True}},
     {"response_format": ResponseFormat(type="json_object")}),
    ({"structured_outputs": {"regex": "[0-9]{3}"}}, {"structured_output": REGEX}),
    ({"structured_outputs": {"choice": ["yes", "no"]}}, {"structured_output": CHOICE}),
    ({"structured_outputs": {"grammar": 'start: "a"+'}}, {"structured_output": GRAMMAR}),
    ({"guided_json": SCHEMA}, {"response_format": AS_SCHEMA}),
    ({"guided_regex": "[0-9]{3}"}, {"structured_output": REGEX}),
    ({"guided_choice": ["yes", "no"]}, {"structured_output": CHOICE}),
    ({"guided_grammar": 'start: "a"+'}, {"structured_output": GRAMMAR}),
    # vLLM's keys that cannot change the answer, and ones left null or false
    ({"structured_outputs": {"regex": "[0-9]{3}", "disable_fallback": True, "json": None,
                             "json_object": False, "whitespace_pattern": None}},
     {"structured_output": REGEX}),
]  # fmt: skip


def constraint_of(req: GenerateRequest) -> dict[str, Any]:
    return {
        name: getattr(req, name)
        for name in ("response_format", "structured_output")
        if getattr(req, name) is not None
    }


@pytest.mark.parametrize(("body", "expected"), GIVEN)
@pytest.mark.parametrize("make", [chat_line, completion_line])
def test_each_way_of_naming_a_constraint_on_both_endpoints(
    make: Any, body: dict[str, Any], expected: dict[str, Any]
) -> None:
    assert constraint_of(request(make(**body))) == expected


def test_response_format_text_beside_a_regex_is_one_constraint() -> None:
    req = request(chat_line(response_format={"type": "text"}, guided_regex="a+"))
    assert req.structured_output == StructuredOutput(regex="a+")
    assert req.response_format == ResponseFormat(type="text")


@pytest.mark.parametrize(
    ("body", "found"),
    [
        ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_regex, guided_choice"),
        ({"structured_outputs": {"regex": "a", "choice": ["a"]}},
         "structured_outputs.regex, structured_outputs.choice"),
        ({"response_format": {"type": "json_object"}, "guided_grammar": 'start: "a"'},
         "response_format, guided_grammar"),
        ({"structured_outputs": {"json": {}}, "guided_json": {}},
         "structured_outputs.json, guided_json"),
    ],
)  # fmt: skip
def test_two_constraints_are_refused(body: dict[str, Any], found: str) -> None:
    refused = request_refused(chat_line(**body))
    assert refused.code == ErrorCode.INVALID_RESPONSE_FORMAT
    assert f"give at most one constraint (found: {found})" in refused.message


@pytest.mark.parametrize(
    ("body", "code", "param", "words"),
    [
        ({"structured_outputs": {"structural_tag": "x"}}, LineCode.UNSUPPORTED_PARAMETER,
         "structured_outputs", "structured_outputs.structural_tag"),
        ({"structured_outputs": {"choice": "yes"}}, ErrorCode.INVALID_RESPONSE_FORMAT,
         "structured_outputs", "got `str` - at `$.choice`"),
        ({"structured_outputs": {"json": "{not json"}}, ErrorCode.INVALID_RESPONSE_FORMAT,
         "structured_outputs", "not JSON"),
        ({"guided_json": "[1, 2]"}, ErrorCode.INVALID_RESPONSE_FORMAT, "guided_json",
         "a JSON schema object"),
        ({"guided_choice": [1, 2]}, LineCode.INVALID_BODY, "guided_choice", "got `int`"),
        ({"guided_decoding_backend": "xgrammar"}, LineCode.UNSUPPORTED_PARAMETER,
         "guided_decoding_backend", "not supported"),
        # the request's own rules, checked with the rest of it
        ({"guided_choice": []}, ErrorCode.INVALID_RESPONSE_FORMAT, None, "1 to 1024 strings"),
        ({"guided_regex": ""}, ErrorCode.INVALID_RESPONSE_FORMAT, None, "regex must be 1 to"),
    ],
)  # fmt: skip
def test_a_malformed_constraint_is_refused_with_its_param(
    body: dict[str, Any], code: str, param: str | None, words: str
) -> None:
    refused = request_refused(completion_line(**body))
    assert (refused.code, refused.param) == (code, param)
    assert words in refused.message


def test_a_refused_constraint_line_keeps_its_custom_id() -> None:
    with pytest.raises(BatchLineRefused) as info:
        to_request(chat_line("c-7", guided_regex="a", guided_grammar="b"), "batch-t-1")
    assert info.value.custom_id == "c-7"
