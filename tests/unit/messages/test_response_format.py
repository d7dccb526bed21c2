"""response_format: a schema is plain JSON, checked without recursion, before it becomes text."""

from __future__ import annotations

import json
import math
from collections import OrderedDict
from datetime import UTC, datetime
from typing import Any

import msgspec
import pytest

from messages.error_codes import ErrorCode
from messages.errors import InvalidRequest
from messages.limits import INT64_LIMIT, MAX_SCHEMA_DEPTH
from messages.response_format import (
    JsonSchemaFormat,
    ResponseFormat,
    canonical,
    check_plain_json,
    check_response_format,
)


def nested(depth: int) -> Any:
    """`depth` arrays, one inside the other."""
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


def refused(value: Any) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        check_plain_json(value)
    assert info.value.code is ErrorCode.INVALID_RESPONSE_FORMAT
    with pytest.raises(InvalidRequest):
        canonical(value)  # what cannot pass the check cannot become text either
    return info.value


@pytest.mark.parametrize(
    "schema",
    [
        {},
        {"type": "object", "properties": {"a": {"type": "string", "maxLength": 3}}},
        {"enum": [None, True, False, 0, -1.5, "é", [1, [2]], {"k": {}}]},
        {"minimum": -INT64_LIMIT, "maximum": INT64_LIMIT - 1, "multipleOf": 1e-300},
        {"d": nested(MAX_SCHEMA_DEPTH - 1)},  # the schema itself is one level
        OrderedDict(b=1, a=2),
    ],
)
def test_plain_json_passes_and_has_a_text(schema: dict[str, Any]) -> None:
    check_plain_json(schema)
    assert json.loads(canonical(schema)) == schema


def test_the_text_keeps_the_key_order() -> None:
    assert canonical({"b": 1, "a": [1.5, None]}) == '{"b":1,"a":[1.5,null]}'


@pytest.mark.parametrize(
    ("schema", "words"),
    [
        ({"a": b"x"}, "a value of type bytes at $.a,"),
        ({"a": [1, msgspec.msgpack.Ext(1, b"x")]}, "a value of type Ext at $.a[1],"),
        ({"a": datetime(2030, 1, 1, tzinfo=UTC)}, "a value of type datetime at $.a,"),
        ({"a": (1, 2)}, "a value of type tuple at $.a,"),
        ({"a": {1: "x"}}, "a key of type int at $.a;"),
        ({"a": {(1,): "x"}}, "a key of type tuple at $.a;"),
        ({"a": math.nan}, "has nan at $.a,"),
        ({"a": -math.inf}, "has -inf at $.a,"),
        ({"a": INT64_LIMIT}, "an integer outside int64 at $.a"),
        ({"a": -INT64_LIMIT - 1}, "an integer outside int64 at $.a"),
        ({"a": 10**400}, "an integer outside int64 at $.a"),
    ],
)
def test_what_json_cannot_hold_is_refused_by_its_place(schema: Any, words: str) -> None:
    assert words in refused(schema).message


@pytest.mark.parametrize("depth", [MAX_SCHEMA_DEPTH, 990, 100_000])
def test_nesting_past_the_limit_is_refused_not_recursed(depth: int) -> None:
    error = refused({"d": nested(depth)})
    assert f"nests deeper than {MAX_SCHEMA_DEPTH} arrays and objects" in error.message
    assert len(error.message) < 300  # the path is cut


def test_a_cycle_is_refused_as_too_deep() -> None:
    schema: dict[str, Any] = {}
    schema["self"] = schema
    assert "nests deeper" in refused(schema).message


def test_a_schema_text_is_refused_not_raised() -> None:
    shape = ResponseFormat(type="json_schema", json_schema=JsonSchemaFormat(schema={"a": b"x"}))
    with pytest.raises(InvalidRequest) as info:
        shape.schema_text()
    assert info.value.code is ErrorCode.INVALID_RESPONSE_FORMAT
    with pytest.raises(InvalidRequest):
        check_response_format(shape)
