"""structured_output: exactly one of regex, choice, grammar, within its limits, and never beside
a constrained response_format; refused at the door (`check_request`) with
`invalid_response_format`; decoded from the wire as producers write it."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from messages.codec import JSON
from messages.error_codes import ErrorCode
from messages.errors import InvalidRequest, UndecodableRequest
from messages.limits import (
    MAX_CHOICE_STRING_CHARS,
    MAX_CHOICE_STRINGS,
    MAX_GRAMMAR_CHARS,
    MAX_REGEX_CHARS,
)
from messages.request import GenerateRequest
from messages.request_decoding import decode_request
from messages.response_format import ResponseFormat
from messages.structured_output import StructuredOutput
from messages.validation import check_request


def request(**fields: Any) -> GenerateRequest:
    return GenerateRequest(id="r1", prompt="Hi", **fields)


def refusal(structured: StructuredOutput, **fields: Any) -> str:
    with pytest.raises(InvalidRequest) as info:
        check_request(request(structured_output=structured, **fields))
    assert info.value.code is ErrorCode.INVALID_RESPONSE_FORMAT
    return info.value.message


@pytest.mark.parametrize(
    ("structured", "rule"),
    [
        (StructuredOutput(regex=r"[0-9]{3}"), ("regex", r"[0-9]{3}")),
        (StructuredOutput(choice=["yes", "no é"]), ("choice", '["yes", "no \\u00e9"]')),
        (StructuredOutput(grammar='start: "a"'), ("grammar", 'start: "a"')),
        (StructuredOutput(regex="x" * MAX_REGEX_CHARS), ("regex", "x" * MAX_REGEX_CHARS)),
    ],
)
def test_one_field_within_its_limits_passes_and_gives_its_rule(
    structured: StructuredOutput, rule: tuple[str, str]
) -> None:
    check_request(request(structured_output=structured))
    assert structured.rule() == rule
    if rule[0] == "choice":
        assert json.loads(rule[1]) == structured.choice


def test_it_passes_beside_an_unconstrained_response_format() -> None:
    text = ResponseFormat(type="text")
    check_request(request(structured_output=StructuredOutput(regex="a"), response_format=text))


@pytest.mark.parametrize(
    ("structured", "words"),
    [
        (StructuredOutput(), "exactly one of regex, choice, grammar (found: none)"),
        (StructuredOutput(regex="a", choice=["a"]), "(found: regex, choice)"),
        (StructuredOutput(regex=""), "structured_output.regex must be 1 to"),
        (StructuredOutput(regex="x" * (MAX_REGEX_CHARS + 1)), f"got {MAX_REGEX_CHARS + 1}"),
        (StructuredOutput(grammar=""), "structured_output.grammar must be 1 to"),
        (StructuredOutput(grammar="x" * (MAX_GRAMMAR_CHARS + 1)), f"{MAX_GRAMMAR_CHARS} char"),
        (StructuredOutput(choice=[]), f"must list 1 to {MAX_CHOICE_STRINGS} strings, got 0"),
        (StructuredOutput(choice=["a"] * (MAX_CHOICE_STRINGS + 1)), "strings, got 1025"),
        (StructuredOutput(choice=["a", ""]), "choice[1] must be 1 to"),
        (StructuredOutput(choice=["x" * (MAX_CHOICE_STRING_CHARS + 1)]), "choice[0] must be"),
    ],
)
def test_a_malformed_one_is_refused_at_the_door(structured: StructuredOutput, words: str) -> None:
    assert words in refusal(structured)


@pytest.mark.parametrize("kind", ["json_object", "json_schema"])
def test_two_constraints_are_refused(kind: str) -> None:
    shaped = msgspec.convert({"type": kind, "json_schema": {"schema": {}}}, ResponseFormat)
    message = refusal(StructuredOutput(choice=["a"]), response_format=shaped)
    assert "at most one constraint" in message and "structured_output.choice" in message


def test_decoded_from_the_wire_and_a_json_key_is_refused_not_ignored() -> None:
    """A JSON schema belongs in response_format: under structured_output it is an unknown
    field, which leaves no constraint given, and that is refused, never run unconstrained."""
    wire = {"id": "r1", "prompt": "Hi", "structured_output": {"choice": ["a", "b"]}}
    decoded = decode_request(json.dumps(wire).encode(), JSON)
    assert decoded.structured_output == StructuredOutput(choice=["a", "b"])
    check_request(decoded)
    wire["structured_output"] = {"json": {"type": "object"}}
    misplaced = decode_request(json.dumps(wire).encode(), JSON)
    with pytest.raises(InvalidRequest) as info:
        check_request(misplaced)
    assert "a JSON schema goes in response_format" in info.value.message


def test_a_wrong_type_is_a_schema_violation() -> None:
    wire = {"id": "r1", "prompt": "Hi", "structured_output": {"choice": "a"}}
    with pytest.raises(UndecodableRequest) as info:
        decode_request(json.dumps(wire).encode(), JSON)
    assert info.value.code is ErrorCode.SCHEMA_VIOLATION
