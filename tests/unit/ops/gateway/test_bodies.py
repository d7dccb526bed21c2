"""HTTP bodies through the batch mapper: what it refuses is a 400 with its code."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from messages.error_codes import ErrorCode
from messages.openai_batch import CHAT_COMPLETIONS_URL, COMPLETIONS_URL
from messages.result import ErrorInfo, FinishReason, GenerateResult
from ops.gateway.bodies import IGNORED_FIELDS_HEADER, answer, parse_body, to_asked
from ops.gateway.errors import ApiError


def chat(**body: object) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": "Hi"}], **body}


def test_a_chat_body_becomes_the_batch_mapper_s_request() -> None:
    asked = to_asked(CHAT_COMPLETIONS_URL, chat(max_tokens=5), "gw-1")
    assert asked.request.id == "gw-1"
    assert asked.request.max_new_tokens == 5
    assert asked.request.messages is not None and asked.request.messages[0].content == "Hi"
    assert not asked.stream and not asked.request.stream


def test_stream_is_the_gateway_s_own_and_include_usage_is_read() -> None:
    body = chat(stream=True, stream_options={"include_usage": True})
    asked = to_asked(CHAT_COMPLETIONS_URL, body, "gw-2")
    assert asked.stream and asked.request.stream and asked.include_usage


def test_n_logprobs_and_a_tool_call_are_streamed() -> None:
    asked = to_asked(COMPLETIONS_URL, {"prompt": "x", "n": 2, "logprobs": 2, "stream": True}, "a")
    assert asked.request.stream and asked.request.n == 2 and asked.request.logprobs == 2
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    body = chat(stream=True, logprobs=True, top_logprobs=1, tools=tools, tool_choice="required")
    asked = to_asked(CHAT_COMPLETIONS_URL, body, "b")
    assert asked.request.stream and asked.tool_call and asked.request.logprobs == 1


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"echo": True, "logprobs": 1}, "echo"),
        ({"echo": True}, "echo"),
        ({"prompt_logprobs": 1}, "prompt_logprobs"),
    ],
)
def test_what_only_the_final_answer_holds_is_not_streamed(
    fields: dict[str, object], param: str
) -> None:
    with pytest.raises(ApiError) as caught:
        to_asked(COMPLETIONS_URL, {"prompt": "x", "stream": True, **fields}, "gw-7")
    assert (caught.value.status, caught.value.code, caught.value.param) == (
        400,
        "unsupported_parameter",
        param,
    )


def test_what_the_door_refuses_keeps_its_code() -> None:
    with pytest.raises(ApiError) as caught:
        to_asked(COMPLETIONS_URL, {"prompt": "x", "temperature": -1}, "gw-4")
    assert caught.value.status == 400
    assert caught.value.code == ErrorCode.INVALID_SAMPLING_PARAMS


def test_unknown_fields_are_ignored_named_and_logged_by_name_only() -> None:
    body = {"prompt": "x", "frobnicate": "secret value", "zeta": 1, "user": "u", "nothing": None}
    with capture_logs() as logs:
        asked = to_asked(COMPLETIONS_URL, body, "gw-5")
    assert asked.ignored == ("frobnicate", "zeta")  # harmless and null fields are not named
    assert asked.ignored_header == {IGNORED_FIELDS_HEADER: "frobnicate,zeta"}
    (event,) = [e for e in logs if e["event"] == "request_fields_ignored"]
    assert event["fields"] == ["frobnicate", "zeta"] and "secret value" not in str(event)


def test_with_strict_fields_unknown_fields_are_refused_as_in_batch_files() -> None:
    with pytest.raises(ApiError) as caught:
        to_asked(COMPLETIONS_URL, {"prompt": "x", "frobnicate": True}, "gw-5", strict_fields=True)
    assert (caught.value.code, caught.value.param) == ("unsupported_parameter", "frobnicate")


def test_nothing_ignored_gives_no_header() -> None:
    asked = to_asked(COMPLETIONS_URL, {"prompt": "x"}, "gw-5")
    assert asked.ignored == () and asked.ignored_header == {}


def test_an_ignored_name_unfit_for_a_header_is_shown_as_a_question_mark() -> None:
    body = {"prompt": "x", "a\r\nSet-Cookie: x": 1, "é": 2, **{f"f{i}": i for i in range(40)}}
    asked = to_asked(COMPLETIONS_URL, body, "gw-5")
    assert asked.ignored[:2] == ("?", "?") and asked.ignored[-1] == "…"
    assert len(asked.ignored) == 33
    assert all(
        ch.isprintable() and ch.isascii() for ch in asked.ignored_header[IGNORED_FIELDS_HEADER][:-1]
    )


def test_a_chat_without_max_tokens_leaves_the_length_and_sampling_to_the_model() -> None:
    asked = to_asked(CHAT_COMPLETIONS_URL, chat(), "gw-7")
    assert asked.request.model_defaults == ["max_new_tokens", "temperature", "top_p", "top_k"]
    assert asked.request.max_new_tokens == 16  # what an older worker runs


def test_completions_keep_16_tokens_and_leave_only_sampling_to_the_model() -> None:
    asked = to_asked(COMPLETIONS_URL, {"prompt": "x"}, "gw-8")
    assert asked.request.model_defaults == ["temperature", "top_p", "top_k"]
    assert asked.request.max_new_tokens == 16


def test_given_fields_are_not_left_to_the_model() -> None:
    body = chat(max_completion_tokens=9, temperature=0, top_p=0.5, top_k=-1)
    asked = to_asked(CHAT_COMPLETIONS_URL, body, "gw-9")
    assert asked.request.model_defaults == []
    assert (asked.request.max_new_tokens, asked.request.temperature) == (9, 0.0)


def test_the_default_max_tokens_setting_sets_an_omitted_max_tokens() -> None:
    asked = to_asked(CHAT_COMPLETIONS_URL, chat(), "gw-10", default_max_tokens=300)
    assert asked.request.max_new_tokens == 300
    assert "max_new_tokens" not in asked.request.model_defaults


def test_an_omitted_max_tokens_holds_min_tokens() -> None:
    asked = to_asked(CHAT_COMPLETIONS_URL, chat(min_tokens=40), "gw-11")
    assert asked.request.max_new_tokens == 40 and asked.request.min_tokens == 40


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]"])
def test_a_body_that_is_no_json_object_is_invalid_json(raw: bytes) -> None:
    with pytest.raises(ApiError) as caught:
        parse_body(raw)
    assert (caught.value.status, caught.value.code) == (400, "invalid_json")


def test_a_worker_s_refusal_gets_the_batch_mapper_s_status() -> None:
    asked = to_asked(COMPLETIONS_URL, {"prompt": "x", "model": "nope"}, "gw-6")
    refused = GenerateResult(
        id="gw-6",
        finish_reason=FinishReason.ERROR,
        error=ErrorInfo(code=ErrorCode.UNKNOWN_MODEL, message="no such model"),
    )
    status, body = answer(asked, refused, created=1)
    assert status == 404
    assert body["error"]["code"] == "unknown_model"


def test_an_answer_is_the_batch_line_s_body() -> None:
    asked = to_asked(COMPLETIONS_URL, {"prompt": "x"}, "gw-7")
    status, body = answer(
        asked, GenerateResult(id="gw-7", text=" y", finish_reason=FinishReason.LENGTH), created=1
    )
    assert status == 200
    assert body["object"] == "text_completion"
    assert body["choices"][0]["text"] == " y"
