"""An `EmbedRequest` decoded and checked at the door: the model-independent rules, each with
its code (the model's own are `tests/unit/actors/ingest/test_model_front_embed.py`'s)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from messages.codec import JSON, MSGPACK
from messages.embedding import EmbedRequest
from messages.error_codes import DEAD_LETTER_CODES, ErrorCode
from messages.errors import InvalidRequest, UndecodableRequest
from messages.limits import MAX_EMBED_INPUTS
from messages.request_decoding import decode_request
from messages.validation import check_embed_request, embed_inputs


def decoded(fields: dict[str, Any], content_type: str = JSON) -> Any:
    """The record as the door decodes it with the header `EmbedRequest/1`."""
    value = {"id": "e1", **fields}
    data = msgspec.msgpack.encode(value) if content_type == MSGPACK else msgspec.json.encode(value)
    return decode_request(data, content_type, kind="embed")


def refused(fields: dict[str, Any]) -> InvalidRequest:
    request = decoded(fields)
    assert isinstance(request, EmbedRequest)
    with pytest.raises(InvalidRequest) as info:
        check_embed_request(request)
    return info.value


@pytest.mark.parametrize("content_type", [JSON, MSGPACK])
def test_an_embed_record_decodes_as_an_embed_request(content_type: str) -> None:
    request = decoded(
        {"input": ["a", "b"], "dimensions": 4, "encoding_format": "base64", "prompt_name": "query",
         "truncate": "end", "metadata": {"k": "v"}},
        content_type,
    )  # fmt: skip
    assert request == EmbedRequest(
        id="e1", input=["a", "b"], dimensions=4, encoding_format="base64", prompt_name="query",
        truncate="end", metadata={"k": "v"},
    )  # fmt: skip
    check_embed_request(request)


@pytest.mark.parametrize(
    ("value", "inputs"),
    [
        ("one text", ["one text"]),
        (["a", "b"], ["a", "b"]),
        ([5, 6, 7], [[5, 6, 7]]),  # one input of token ids
        ([[5, 6], [7]], [[5, 6], [7]]),
    ],
)
def test_input_is_one_input_or_a_list_of_one_kind(value: Any, inputs: list[Any]) -> None:
    assert embed_inputs(value) == inputs
    check_embed_request(EmbedRequest(id="e", input=value))


@pytest.mark.parametrize(
    ("fields", "code", "words"),
    [
        ({}, ErrorCode.INVALID_PROMPT, "needs `input`"),
        ({"input": None}, ErrorCode.INVALID_PROMPT, "needs `input`"),
        ({"input": ""}, ErrorCode.EMPTY_PROMPT, "input 0 is empty"),
        ({"input": []}, ErrorCode.EMPTY_PROMPT, "empty list"),
        ({"input": ["a", ""]}, ErrorCode.EMPTY_PROMPT, "input 1 is empty"),
        ({"input": [[1], []]}, ErrorCode.EMPTY_PROMPT, "input 1 is empty"),
        ({"input": ["a", 1]}, ErrorCode.INVALID_PROMPT, "mixes kinds"),
        ({"input": ["a", [1]]}, ErrorCode.INVALID_PROMPT, "mixes kinds"),
        ({"input": [1, [2]]}, ErrorCode.INVALID_PROMPT, "mixes kinds"),
        ({"input": [[1, -1]]}, ErrorCode.TOKEN_OUT_OF_VOCABULARY, "input 0"),
        ({"input": [2**31]}, ErrorCode.TOKEN_OUT_OF_VOCABULARY, "2147483648"),
        ({"input": "x", "dimensions": 0}, ErrorCode.INVALID_DIMENSIONS, "positive"),
        ({"input": "x", "dimensions": -3}, ErrorCode.INVALID_DIMENSIONS, "positive"),
        ({"input": "x", "reply_to": "bad topic!"}, ErrorCode.INVALID_REPLY_TO, "reply_to"),
        ({"input": "x", "timeout_ms": 0}, ErrorCode.INVALID_REQUEST, "timeout_ms"),
        ({"input": "x", "priority": 1000}, ErrorCode.INVALID_REQUEST, "priority"),
        ({"input": "x", "v": -1}, ErrorCode.INVALID_REQUEST, "schema version"),
    ],
)
def test_each_broken_rule_has_its_code(fields: dict[str, Any], code: ErrorCode, words: str) -> None:
    error = refused(fields)
    assert error.code is code, error.message
    assert words in error.message


def _check(request: EmbedRequest) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        check_embed_request(request)
    return info.value


def test_at_most_max_embed_inputs() -> None:
    check_embed_request(EmbedRequest(id="e", input=["x"] * MAX_EMBED_INPUTS))
    error = _check(EmbedRequest(id="e", input=["x"] * (MAX_EMBED_INPUTS + 1)))
    assert error.code is ErrorCode.INVALID_PROMPT
    assert str(MAX_EMBED_INPUTS) in error.message


def test_metadata_is_bounded_as_a_generation_requests() -> None:
    error = _check(EmbedRequest(id="e", input="x", metadata={str(i): "v" for i in range(65)}))
    assert error.code is ErrorCode.INVALID_REQUEST and "metadata" in error.message


@pytest.mark.parametrize(
    "value", [[["a"]], {"text": "a"}, 5, [1, 2.5], [[[1]]], [True], [None]], ids=str
)
def test_an_input_of_the_wrong_shape_is_an_invalid_prompt_not_a_dead_letter(value: Any) -> None:
    with pytest.raises(UndecodableRequest) as info:
        decoded({"input": value, "reply_to": "mine"}, JSON)
    assert info.value.code is ErrorCode.INVALID_PROMPT
    assert info.value.code not in DEAD_LETTER_CODES
    assert "`input` must be" in info.value.message
    assert (info.value.request_id, info.value.reply_to) == ("e1", "mine")


@pytest.mark.parametrize(
    "fields",
    [{"dimensions": "4"}, {"encoding_format": "int8"}, {"truncate": "middle"}, {"metadata": []}],
    ids=str,
)
def test_another_field_of_the_wrong_type_is_a_schema_violation(fields: dict[str, Any]) -> None:
    with pytest.raises(UndecodableRequest) as info:
        decoded({"input": "x", **fields})
    assert info.value.code is ErrorCode.SCHEMA_VIOLATION
    assert info.value.request_id == "e1"


def test_the_id_rules_are_a_generation_requests() -> None:
    with pytest.raises(UndecodableRequest) as info:
        decode_request(b'{"input": "x"}')
    assert info.value.code is ErrorCode.MISSING_ID
    with pytest.raises(UndecodableRequest) as info:
        decode_request(msgspec.json.encode({"id": "x" * 600, "input": "x"}))
    assert info.value.code is ErrorCode.ID_TOO_LONG
    with pytest.raises(UndecodableRequest) as info:
        decode_request(b'{"id": "a", "id": "b", "input": "x"}')
    assert info.value.code is ErrorCode.INVALID_JSON


def test_the_kind_given_is_the_one_decoded_else_the_bodys() -> None:
    data = b'{"id": "a", "input": "x", "prompt": "y"}'
    assert isinstance(decode_request(data, JSON, kind="embed"), EmbedRequest)
    assert not isinstance(decode_request(data, JSON), EmbedRequest)
    assert isinstance(decode_request(b'{"id": "a", "input": "x"}', JSON), EmbedRequest)
