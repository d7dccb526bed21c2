"""check_request: each model-independent rule a decoded request breaks has its own code."""

from __future__ import annotations

import math
from typing import Any

import msgspec
import pytest

from messages.error_codes import ErrorCode
from messages.errors import InvalidRequest
from messages.limits import (
    MAX_NEW_TOKENS,
    MAX_PRIORITY,
    MAX_STREAM_INTERVAL_MS,
    MAX_STREAM_INTERVAL_TOKENS,
    MAX_TIMEOUT_MS,
    MIN_PRIORITY,
)
from messages.request import ChatMessage, GenerateRequest
from messages.response_format import JsonSchemaFormat, ResponseFormat
from messages.validation import check_request

HI = [ChatMessage(role="user", content="hi")]


def request(**fields: Any) -> GenerateRequest:
    fields.setdefault("id", "r1")
    if not {"prompt", "prompt_token_ids", "messages"} & fields.keys():
        fields["prompt"] = "Hello"
    return GenerateRequest(**fields)


def broken(req: GenerateRequest) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        check_request(req)
    assert info.value.message
    assert str(info.value) == info.value.message
    return info.value


@pytest.mark.parametrize(
    "fields",
    [
        {"prompt": "Hello"},
        {"prompt_token_ids": [1, 2, 3]},
        {"messages": HI},
        {"prompt": "x", "max_new_tokens": 1, "temperature": 1.5, "top_p": 1.0, "top_k": 50},
        {"prompt": "x", "top_p": 1e-9, "stop": ["\n", "END"], "timeout_ms": 1},
        {"prompt": "x", "reply_to": "team.replies-v2_x"},
        {"prompt": "x", "reply_to": "a" * 249},
    ],
)
def test_a_valid_request_passes(fields: dict[str, Any]) -> None:
    check_request(request(**fields))


@pytest.mark.parametrize(
    ("fields", "found"),
    [
        ({"prompt": "x", "prompt_token_ids": [1]}, "prompt, prompt_token_ids"),
        ({"prompt": "x", "messages": HI}, "prompt, messages"),
        ({"prompt_token_ids": [1], "messages": HI}, "prompt_token_ids, messages"),
        (
            {"prompt": "x", "prompt_token_ids": [1], "messages": HI},
            "prompt, prompt_token_ids, messages",
        ),
    ],
)
def test_more_than_one_prompt_is_invalid(fields: dict[str, Any], found: str) -> None:
    error = broken(request(**fields))
    assert error.code is ErrorCode.INVALID_PROMPT
    assert f"(found: {found})" in error.message


def test_no_prompt_is_invalid() -> None:
    error = broken(GenerateRequest(id="r1"))
    assert error.code is ErrorCode.INVALID_PROMPT
    assert "(found: none)" in error.message


@pytest.mark.parametrize(
    ("fields", "name"),
    [
        ({"prompt": ""}, "prompt"),
        ({"prompt_token_ids": []}, "prompt_token_ids"),
        ({"messages": []}, "messages"),
    ],
)
def test_an_empty_prompt(fields: dict[str, Any], name: str) -> None:
    error = broken(request(**fields))
    assert error.code is ErrorCode.EMPTY_PROMPT
    assert error.message == f"`{name}` is empty"


@pytest.mark.parametrize("max_new_tokens", [0, -1])
def test_max_new_tokens_must_be_positive(max_new_tokens: int) -> None:
    error = broken(request(max_new_tokens=max_new_tokens))
    assert error.code is ErrorCode.INVALID_MAX_TOKENS
    assert str(max_new_tokens) in error.message


def test_max_new_tokens_may_be_0_with_prompt_logprobs() -> None:
    check_request(request(max_new_tokens=0, prompt_logprobs=0))
    error = broken(request(max_new_tokens=-1, prompt_logprobs=0))
    assert error.code is ErrorCode.INVALID_MAX_TOKENS


@pytest.mark.parametrize("k", [-1, 21])
def test_prompt_logprobs_in_0_to_20(k: int) -> None:
    error = broken(request(prompt_logprobs=k))
    assert error.code is ErrorCode.INVALID_SAMPLING_PARAMS
    assert error.message.startswith("prompt_logprobs must be in [0, 20]")
    check_request(request(prompt_logprobs=20))


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": math.nan}, "temperature"),
        ({"temperature": math.inf}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_p": math.nan}, "top_p"),
        ({"top_p": -0.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"stop": [""]}, "stop strings"),
        ({"stop": ["ok", ""]}, "stop strings"),
        ({"logprobs": 21}, "logprobs"),
        ({"logprobs": -1}, "logprobs"),
    ],
)
def test_sampling_params(fields: dict[str, Any], words: str) -> None:
    error = broken(request(**fields))
    assert error.code is ErrorCode.INVALID_SAMPLING_PARAMS
    assert words in error.message


def test_nan_sampling_params_cannot_arrive_as_json() -> None:
    """JSON has no NaN: the check above guards MessagePack and in-process callers."""
    with pytest.raises(msgspec.DecodeError):
        msgspec.json.decode(b'{"id": "r1", "prompt": "x", "top_p": NaN}', type=GenerateRequest)
    data = msgspec.msgpack.encode({"id": "r1", "prompt": "x", "top_p": math.nan})
    decoded = msgspec.msgpack.decode(data, type=GenerateRequest)
    assert broken(decoded).code is ErrorCode.INVALID_SAMPLING_PARAMS


@pytest.mark.parametrize("timeout_ms", [0, -5])
def test_timeout_must_be_positive(timeout_ms: int) -> None:
    error = broken(request(timeout_ms=timeout_ms))
    assert error.code is ErrorCode.INVALID_REQUEST  # a bad value, not an expired deadline
    assert f"timeout_ms must be positive, got {timeout_ms}" == error.message


@pytest.mark.parametrize("reply_to", ["bad topic!", "a" * 250, "", "tëam", "a/b"])
def test_reply_to_must_be_a_topic_name(reply_to: str) -> None:
    error = broken(request(reply_to=reply_to))
    assert error.code is ErrorCode.INVALID_REPLY_TO
    assert repr(reply_to) in error.message


@pytest.mark.parametrize("reply_to", [".", ".."])
def test_dot_topic_names_are_not_reply_topics(reply_to: str) -> None:
    assert broken(request(reply_to=reply_to)).code is ErrorCode.INVALID_REPLY_TO


def test_the_first_broken_rule_is_reported() -> None:
    """Prompt shape before max tokens before sampling before reply_to before timeout."""
    req = request(
        prompt="",
        max_new_tokens=0,
        temperature=-1.0,
        reply_to="bad topic!",
        timeout_ms=0,
    )
    assert broken(req).code is ErrorCode.EMPTY_PROMPT
    req.prompt = "x"
    assert broken(req).code is ErrorCode.INVALID_MAX_TOKENS
    req.max_new_tokens = 1
    assert broken(req).code is ErrorCode.INVALID_SAMPLING_PARAMS
    req.temperature = 0.0
    assert broken(req).code is ErrorCode.INVALID_REPLY_TO
    req.reply_to = None
    assert broken(req).code is ErrorCode.INVALID_REQUEST


@pytest.mark.parametrize(
    "fields",
    [
        {"stop": ["x"] * 17},
        {"stop": ["x" * 257]},
        {"stop_token_ids": list(range(65))},
        {"seed": 2**63},
        {"seed": -1},
    ],
)
def test_what_a_request_makes_the_worker_scan_is_capped(fields: dict) -> None:
    assert broken(request(**fields)).code is ErrorCode.INVALID_SAMPLING_PARAMS


def test_metadata_is_capped_because_it_is_echoed_back() -> None:
    assert broken(request(metadata={str(i): "v" for i in range(65)})).code is (
        ErrorCode.INVALID_REQUEST
    )
    assert broken(request(metadata={"k": "v" * 20000})).code is ErrorCode.INVALID_REQUEST


@pytest.mark.parametrize(
    "response_format",
    [
        ResponseFormat(type="xml"),
        ResponseFormat(type="json_schema"),  # json_schema missing
        ResponseFormat(
            type="json_schema",
            json_schema=JsonSchemaFormat(schema={"enum": ["x" * 1000] * 100}),  # too large
        ),
    ],
)
def test_a_malformed_response_format_is_invalid_response_format(
    response_format: ResponseFormat,
) -> None:
    with pytest.raises(InvalidRequest) as caught:
        check_request(GenerateRequest(id="r", prompt="p", response_format=response_format))
    assert caught.value.code == ErrorCode.INVALID_RESPONSE_FORMAT


@pytest.mark.parametrize(
    "response_format",
    [
        None,
        ResponseFormat(),
        ResponseFormat(type="json_object"),
        ResponseFormat(type="json_schema", json_schema=JsonSchemaFormat(schema={"type": "array"})),
    ],
)
def test_well_formed_response_formats_pass(response_format: ResponseFormat | None) -> None:
    check_request(GenerateRequest(id="r", prompt="p", response_format=response_format))


# --- the range of every number (messages.limits) --------------------------------------------

HUGE = 10**400  # JSON carries integers of up to 4300 digits


@pytest.mark.parametrize(
    "fields",
    [
        {"timeout_ms": MAX_TIMEOUT_MS},
        {"priority": MIN_PRIORITY},
        {"priority": MAX_PRIORITY},
        {"v": 0},
        {"v": 2**63 - 1},
        {"stream_interval_tokens": 1},
        {"stream_interval_tokens": MAX_STREAM_INTERVAL_TOKENS},
        {"stream_interval_ms": 0.0},
        {"stream_interval_ms": MAX_STREAM_INTERVAL_MS},
        {"max_new_tokens": MAX_NEW_TOKENS},
        {"prompt_token_ids": [0, 2**31 - 1]},
    ],
)
def test_numbers_at_the_edge_of_their_range_pass(fields: dict[str, Any]) -> None:
    check_request(request(**fields))


@pytest.mark.parametrize(
    ("fields", "code", "words"),
    [
        ({"timeout_ms": MAX_TIMEOUT_MS + 1}, ErrorCode.INVALID_REQUEST, "timeout_ms"),
        ({"timeout_ms": HUGE}, ErrorCode.INVALID_REQUEST, "timeout_ms"),
        ({"priority": MIN_PRIORITY - 1}, ErrorCode.INVALID_REQUEST, "priority"),
        ({"priority": MAX_PRIORITY + 1}, ErrorCode.INVALID_REQUEST, "priority"),
        ({"priority": -HUGE}, ErrorCode.INVALID_REQUEST, "priority"),
        ({"v": -1}, ErrorCode.INVALID_REQUEST, "v (the schema version)"),
        ({"v": 2**63}, ErrorCode.INVALID_REQUEST, "v (the schema version)"),
        ({"stream_interval_tokens": 0}, ErrorCode.INVALID_REQUEST, "stream_interval_tokens"),
        (
            {"stream_interval_tokens": MAX_STREAM_INTERVAL_TOKENS + 1},
            ErrorCode.INVALID_REQUEST,
            "stream_interval_tokens",
        ),
        ({"stream_interval_ms": -1.0}, ErrorCode.INVALID_REQUEST, "stream_interval_ms"),
        ({"stream_interval_ms": math.nan}, ErrorCode.INVALID_REQUEST, "stream_interval_ms"),
        ({"stream_interval_ms": math.inf}, ErrorCode.INVALID_REQUEST, "stream_interval_ms"),
        ({"max_new_tokens": MAX_NEW_TOKENS + 1}, ErrorCode.MAX_TOKENS_TOO_LARGE, "max_new_tokens"),
        ({"max_new_tokens": HUGE}, ErrorCode.MAX_TOKENS_TOO_LARGE, "max_new_tokens"),
        ({"top_k": HUGE}, ErrorCode.INVALID_SAMPLING_PARAMS, "top_k"),
        ({"seed": HUGE}, ErrorCode.INVALID_SAMPLING_PARAMS, "seed"),
        ({"prompt_token_ids": [1, 2**31]}, ErrorCode.TOKEN_OUT_OF_VOCABULARY, "2147483648"),
        ({"prompt_token_ids": [-1]}, ErrorCode.TOKEN_OUT_OF_VOCABULARY, "prompt_token_ids"),
        ({"stop_token_ids": [HUGE]}, ErrorCode.TOKEN_OUT_OF_VOCABULARY, "stop_token_ids"),
    ],
)
def test_a_number_out_of_its_range_is_refused(
    fields: dict[str, Any], code: ErrorCode, words: str
) -> None:
    error = broken(request(**fields))
    assert error.code is code
    assert words in error.message
    assert len(error.message) < 200, "a 401-digit number is not repeated back whole"


def test_a_huge_number_is_shown_by_its_digits() -> None:
    error = broken(request(priority=HUGE))
    assert "got 100000000000… (401 digits)" in error.message


def test_the_ranges_come_after_the_older_rules() -> None:
    """Prompt, max tokens, sampling, reply_to, then timeout, intervals, priority, v."""
    req = request(timeout_ms=HUGE, stream_interval_tokens=0, priority=HUGE, v=-1)
    assert "timeout_ms" in broken(req).message
    req.timeout_ms = None
    assert "stream_interval_tokens" in broken(req).message
    req.stream_interval_tokens = None
    assert "priority" in broken(req).message
    req.priority = 0
    assert "v (the schema version)" in broken(req).message
