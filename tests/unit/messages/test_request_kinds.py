"""Which kind a request record is: its schema header, else the body's rule."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from messages import headers as h
from messages.codec import JSON, MSGPACK
from messages.embedding import EmbedRequest, EmbedResult
from messages.request import GenerateRequest
from messages.request_kinds import RESULT_SCHEMAS, kind_of, request_kind
from messages.result import GenerateResult


def body(value: Any, content_type: str = JSON) -> bytes:
    if content_type == MSGPACK:
        return msgspec.msgpack.encode(value)
    return msgspec.json.encode(value)


@pytest.mark.parametrize("content_type", [JSON, MSGPACK])
@pytest.mark.parametrize(
    ("fields", "kind"),
    [
        ({"input": "a text"}, "embed"),
        ({"input": ["a", "b"]}, "embed"),
        ({"input": [[1, 2], [3]]}, "embed"),
        ({"input": "x", "prompt": None, "messages": None}, "embed"),  # null is absent
        ({"input": "x", "prompt": "y"}, "generate"),
        ({"input": "x", "prompt_token_ids": [1]}, "generate"),
        ({"input": "x", "messages": []}, "generate"),
        ({"input": None}, "generate"),
        ({"prompt": "y"}, "generate"),
        ({}, "generate"),
    ],
)
def test_without_a_header_the_body_decides(
    fields: dict[str, Any], kind: str, content_type: str
) -> None:
    assert request_kind(body({"id": "r", **fields}, content_type), content_type, None) == kind


@pytest.mark.parametrize(
    "data", [b"", b"{not json", b"[1, 2]", b'"input"', b'{"input": "x"', b"\xff\xfe"]
)
def test_what_is_not_an_object_is_a_generation_request_refused_as_always(data: bytes) -> None:
    assert request_kind(data, JSON, None) == "generate"
    assert request_kind(None, JSON, None) == "generate"


def test_the_schema_header_wins_over_the_body() -> None:
    embed_body = body({"id": "r", "input": "x"})
    assert request_kind(embed_body, JSON, h.GENERATE_REQUEST_SCHEMA.encode()) == "generate"
    assert request_kind(b'{"id": "r"}', JSON, h.EMBED_REQUEST_SCHEMA.encode()) == "embed"
    assert request_kind(b'{"id": "r"}', JSON, b" EmbedRequest/1 ") == "embed"


def test_a_header_of_no_known_kind_leaves_it_to_the_body() -> None:
    assert request_kind(body({"id": "r", "input": "x"}), JSON, b"EmbedRequest/2") == "embed"
    assert request_kind(body({"id": "r", "prompt": "x"}), JSON, b"Other/1") == "generate"


def test_a_request_says_its_kind_and_a_result_its_schema() -> None:
    assert kind_of(EmbedRequest(id="a", input="x")) == "embed"
    assert kind_of(GenerateRequest(id="a", prompt="x")) == "generate"
    assert {
        GenerateResult: "GenerateResult/1",
        EmbedResult: "EmbedResult/1",
    } == RESULT_SCHEMAS


def test_an_encoded_embed_request_reads_back_as_one_without_its_header() -> None:
    """A retry re-encodes the request: its body alone still says what it is."""
    for content_type in (JSON, MSGPACK):
        data = body(msgspec.to_builtins(EmbedRequest(id="a", input=[[5, 6]])), content_type)
        assert request_kind(data, content_type, None) == "embed"
