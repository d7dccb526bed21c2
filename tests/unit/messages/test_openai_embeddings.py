"""`/v1/embeddings` bodies → `EmbedRequest` and `EmbedResult` → OpenAI's embeddings list (and
the batch output line that carries it), without a worker."""

from __future__ import annotations

import base64
import struct
from typing import Any

import msgspec
import pytest

from messages.embedding import Embedding, EmbedRequest, EmbedResult, EmbedUsage
from messages.error_codes import ErrorCode
from messages.errors import BatchLineRefused
from messages.limits import MAX_EMBED_INPUTS
from messages.openai_batch import EMBEDDINGS_URL, BatchInputLine
from messages.openai_batch_answers import answer_line
from messages.openai_batch_mapping import parse_line
from messages.openai_embeddings import embedding_list, to_embed_request, unknown_fields
from messages.result import ErrorInfo, ModelRef


def embed_line(custom_id: str = "e1", **body: Any) -> BatchInputLine:
    body.setdefault("input", "Hello")
    return BatchInputLine(custom_id=custom_id, url=EMBEDDINGS_URL, body=body)


def mapped(**body: Any) -> EmbedRequest:
    return to_embed_request(embed_line(**body), "req-1")


def refused(**body: Any) -> BatchLineRefused:
    with pytest.raises(BatchLineRefused) as info:
        to_embed_request(embed_line(**body), "req-1")
    assert info.value.custom_id == "e1"  # the line's error names it
    return info.value


def test_a_batch_line_for_embeddings_parses_and_maps_with_the_wire_defaults() -> None:
    raw = b'{"custom_id": "d1", "method": "POST", "url": "/v1/embeddings", '
    raw += b'"body": {"model": "embeddinggemma-300m", "input": "Kafka topics"}}'
    request = to_embed_request(parse_line(raw), "batch-x-1")
    assert request == EmbedRequest(
        id="batch-x-1",
        input="Kafka topics",
        model="embeddinggemma-300m",
        encoding_format="float",
        truncate="none",
        metadata={"custom_id": "d1"},
    )


@pytest.mark.parametrize(
    "given",
    [
        "one text",
        ["a", "b", "c"],
        [2, 651, 1],  # one input's token ids
        [[2, 651], [2, 7, 1]],  # several inputs' token ids
    ],
)
def test_every_input_form_openai_takes_goes_as_it_is(given: Any) -> None:
    assert mapped(input=given).input == given


@pytest.mark.parametrize(
    ("given", "code"),
    [
        ("", ErrorCode.EMPTY_PROMPT),
        ([], ErrorCode.EMPTY_PROMPT),
        (["a", ""], ErrorCode.EMPTY_PROMPT),
        ([[1, 2], []], ErrorCode.EMPTY_PROMPT),
        (["a", 1], ErrorCode.INVALID_PROMPT),
        ([[1], 2], ErrorCode.INVALID_PROMPT),
        ([[1], ["a"]], "invalid_body"),  # the body's shape: what msgspec checks
        ([True, 1], "invalid_body"),
        ([{"text": "a"}], "invalid_body"),
        (["x"] * (MAX_EMBED_INPUTS + 1), ErrorCode.INVALID_PROMPT),
        ([1, -2], ErrorCode.TOKEN_OUT_OF_VOCABULARY),
        ([[1], [-2]], ErrorCode.TOKEN_OUT_OF_VOCABULARY),
        ([[1], [2**31]], ErrorCode.TOKEN_OUT_OF_VOCABULARY),
    ],
)
def test_inputs_that_cannot_be_embedded_are_refused_naming_input(given: Any, code: str) -> None:
    error = refused(input=given)
    assert (error.code, error.param) == (code, "input")


def test_the_most_inputs_openai_takes_are_taken() -> None:
    assert len(mapped(input=["x"] * MAX_EMBED_INPUTS).input or []) == MAX_EMBED_INPUTS


def test_a_body_of_the_wrong_shape_names_the_field() -> None:
    assert (refused(input=5).code, refused(input=5).param) == ("invalid_body", "input")
    assert refused(dimensions="256").param == "dimensions"
    missing = to_embed_request
    with pytest.raises(BatchLineRefused) as info:
        missing(BatchInputLine(custom_id="e1", url=EMBEDDINGS_URL, body={"model": "m"}), "r")
    assert (info.value.code, info.value.param) == ("invalid_body", "input")


def test_the_wire_s_own_rules_apply_as_a_worker_would_apply_them() -> None:
    assert (refused(priority=1000).code, refused(priority=1000).param) == ("invalid_request", None)


def test_dimensions_format_prompt_name_and_priority_are_carried() -> None:
    request = mapped(dimensions=256, encoding_format="base64", prompt_name="query", priority=3)
    assert (request.dimensions, request.encoding_format) == (256, "base64")
    assert (request.prompt_name, request.priority) == ("query", -3)  # vLLM's lower-first
    assert mapped(encoding_format=None).encoding_format == "float"
    assert (refused(dimensions=0).code, refused(dimensions=0).param) == (
        ErrorCode.INVALID_DIMENSIONS,
        "dimensions",
    )
    wrong = refused(encoding_format="float16")
    assert (wrong.code, wrong.param) == ("invalid_body", "encoding_format")


@pytest.mark.parametrize(
    ("body", "truncate"),
    [
        ({}, "none"),
        ({"truncate": False}, "none"),
        ({"truncate": True}, "end"),  # TEI's: its default direction is right
        ({"truncate": True, "truncation_direction": "Left"}, "start"),
        ({"truncate": True, "truncation_direction": "right"}, "end"),
        ({"truncate": "start"}, "start"),  # the wire's own values
        ({"truncate": "none"}, "none"),
        ({"truncate_prompt_tokens": -1}, "start"),  # vLLM's: left truncation by default
        ({"truncate_prompt_tokens": -1, "truncation_side": "right"}, "end"),
    ],
)
def test_tei_s_and_vllm_s_truncation_map_onto_the_wire_s(
    body: dict[str, Any], truncate: str
) -> None:
    assert mapped(**body).truncate == truncate


@pytest.mark.parametrize(
    ("body", "code", "param"),
    [
        ({"truncate_prompt_tokens": 128}, "unsupported_parameter", "truncate_prompt_tokens"),
        (
            {"truncate_prompt_tokens": -1, "truncate": True},
            "invalid_body",
            "truncate_prompt_tokens",
        ),
        ({"truncate": "middle"}, "invalid_body", "truncate"),
        ({"truncate": True, "truncation_direction": "up"}, "invalid_body", "truncation_direction"),
    ],
)
def test_truncation_that_cannot_be_honoured_is_refused(
    body: dict[str, Any], code: str, param: str
) -> None:
    error = refused(**body)
    assert (error.code, error.param) == (code, param)


def test_unknown_fields_are_refused_unless_ignored_and_harmless_ones_pass() -> None:
    line = embed_line(user="u-1", normalize=False, add_special_tokens=None, extra=1)
    assert unknown_fields(line) == ("normalize", "extra")
    with pytest.raises(BatchLineRefused) as info:
        to_embed_request(line, "r")
    assert (info.value.code, info.value.param) == ("unsupported_parameter", "normalize")
    assert to_embed_request(line, "r", ignore_unknown=True).input == "Hello"
    assert to_embed_request(line, "r", model="other", ignore_unknown=True).model == "other"


def floats_b64(values: list[float]) -> str:
    return base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode()


def result(**fields: Any) -> EmbedResult:
    fields.setdefault("data", [Embedding(index=0, embedding=[0.6, 0.8])])
    model = ModelRef(name="embeddinggemma-300m", digest="sha256:x", task="embed")
    return EmbedResult(
        id="req-1", model=model, usage=EmbedUsage(prompt_tokens=5, total_tokens=5), **fields
    )


def test_a_result_is_answered_as_openai_s_list_in_its_field_order() -> None:
    answer = msgspec.json.decode(msgspec.json.encode(embedding_list(result())))
    assert list(answer) == ["object", "data", "model", "usage"]
    assert answer == {
        "object": "list",
        "data": [{"object": "embedding", "index": 0, "embedding": [0.6, 0.8]}],
        "model": "embeddinggemma-300m",
        "usage": {"prompt_tokens": 5, "total_tokens": 5},
    }


def test_base64_vectors_go_as_the_worker_wrote_them() -> None:
    data = [Embedding(index=i, embedding=floats_b64([0.5, -0.25])) for i in range(2)]
    answer = embedding_list(result(data=data))
    assert [e.embedding for e in answer.data] == [floats_b64([0.5, -0.25])] * 2
    assert [e.index for e in answer.data] == [0, 1]


def test_the_batch_line_of_a_result_and_of_a_refusal() -> None:
    ok = answer_line("d1", EMBEDDINGS_URL, result())
    assert ok.custom_id == "d1" and ok.response is not None
    assert (ok.response.status_code, ok.response.request_id) == (200, "req-1")
    assert msgspec.to_builtins(ok.response.body)["object"] == "list"
    error = ErrorInfo(code=ErrorCode.UNSUPPORTED_TASK, message="this worker generates text")
    no = answer_line("d1", EMBEDDINGS_URL, result(error=error, data=[]))
    assert no.response is not None and no.response.status_code == 400
    assert msgspec.to_builtins(no.response.body) == {
        "error": {
            "message": "this worker generates text",
            "type": "invalid_request_error",
            "param": None,
            "code": "unsupported_task",
        }
    }
