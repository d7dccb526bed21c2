"""OpenAI Batch lines ⇄ tokenmill messages: parse_line, to_request, answer_line, refusal_line.

Input lines become a `GenerateRequest` or a `BatchLineRefused` with a closed code (and the
offending `param`); results and refusals become output lines in OpenAI's batch output shape,
which a resumed run reads back as `AnsweredLine`s.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from messages.error_codes import ErrorCode
from messages.errors import BatchLineRefused
from messages.openai_batch import (
    CHAT_COMPLETIONS_URL,
    COMPLETIONS_URL,
    AnsweredLine,
    BatchInputLine,
    BatchOutputLine,
)
from messages.openai_batch_answers import answer_line, refusal_line
from messages.openai_batch_mapping import LineCode, parse_line, to_request
from messages.request import ChatMessage, GenerateRequest
from messages.result import (
    Choice,
    ErrorInfo,
    FinishReason,
    GenerateResult,
    ModelRef,
    TokenLogprobs,
    Usage,
)

MODEL = ModelRef(name="smollm2-135m", digest="sha256:" + "ab" * 32)
HI = [{"role": "user", "content": "Hi"}]
_answered_decoder = msgspec.json.Decoder(AnsweredLine)


def raw_line(**fields: Any) -> bytes:
    """An encoded input line; `custom_id`, `method`, `url` and `body` default to a good chat."""
    line: dict[str, Any] = {
        "custom_id": "q1",
        "method": "POST",
        "url": CHAT_COMPLETIONS_URL,
        "body": {"messages": HI},
    }
    line.update(fields)
    return msgspec.json.encode(line) + b"\n"


def chat_line(custom_id: str = "q1", **body: Any) -> BatchInputLine:
    return BatchInputLine(
        custom_id=custom_id, url=CHAT_COMPLETIONS_URL, body={"messages": HI, **body}
    )


def completion_line(custom_id: str = "q1", **body: Any) -> BatchInputLine:
    return BatchInputLine(custom_id=custom_id, url=COMPLETIONS_URL, body={"prompt": "Hi", **body})


def line_refused(raw: bytes) -> BatchLineRefused:
    with pytest.raises(BatchLineRefused) as info:
        parse_line(raw)
    assert info.value.message
    return info.value


def request_refused(line: BatchInputLine, **kw: Any) -> BatchLineRefused:
    with pytest.raises(BatchLineRefused) as info:
        to_request(line, "batch-t-1", **kw)
    assert info.value.message
    assert info.value.custom_id == line.custom_id, "a body refusal keeps the line's custom_id"
    return info.value


def request(line: BatchInputLine, **kw: Any) -> GenerateRequest:
    return to_request(line, "batch-t-1", **kw)


def ok_result(**fields: Any) -> GenerateResult:
    fields = {
        "id": "batch-t-1",
        "text": "Hello there",
        "token_ids": [1, 2],
        "finish_reason": FinishReason.LENGTH,
        "usage": Usage(prompt_tokens=3, completion_tokens=2, total_tokens=5, cached_tokens=2),
        "model": MODEL,
        **fields,
    }
    return GenerateResult(**fields)


def error_result(code: ErrorCode, message: str = "why it failed") -> GenerateResult:
    return GenerateResult(id="batch-t-1", error=ErrorInfo(code=code, message=message))


def as_json(line: BatchOutputLine) -> dict[str, Any]:
    decoded: dict[str, Any] = msgspec.json.decode(msgspec.json.encode(line))
    return decoded


# --- parse_line: the envelope ---------------------------------------------------------------


def test_parse_line_reads_a_chat_line() -> None:
    line = parse_line(raw_line(custom_id="capital", body={"messages": HI, "max_tokens": 8}))
    assert line == BatchInputLine(
        custom_id="capital",
        method="POST",
        url=CHAT_COMPLETIONS_URL,
        body={"messages": HI, "max_tokens": 8},
    )


def test_parse_line_reads_a_completion_line_without_a_method() -> None:
    raw = msgspec.json.encode({"custom_id": "c", "url": COMPLETIONS_URL, "body": {"prompt": "x"}})
    line = parse_line(raw)
    assert (line.custom_id, line.method, line.url) == ("c", "POST", COMPLETIONS_URL)
    assert line.body == {"prompt": "x"}


@pytest.mark.parametrize("raw", [b"{not json", b'{"custom_id": "q1"', b"", b"\xff\xfe"])
def test_a_line_that_is_not_json_is_invalid_json(raw: bytes) -> None:
    refused = line_refused(raw)
    assert refused.code == LineCode.INVALID_JSON
    assert refused.custom_id is None


@pytest.mark.parametrize("raw", [b'[{"custom_id": "q1"}]', b'"q1"', b"42", b"null"])
def test_a_line_that_is_not_a_json_object_is_invalid_json(raw: bytes) -> None:
    refused = line_refused(raw)
    assert refused.code == LineCode.INVALID_JSON
    assert refused.custom_id is None


@pytest.mark.parametrize("custom_id", ["", 7, None, ["q1"], {"id": "q1"}])
def test_a_missing_or_unusable_custom_id_is_refused(custom_id: object) -> None:
    refused = line_refused(raw_line(custom_id=custom_id))
    assert refused.code == LineCode.MISSING_CUSTOM_ID
    assert (refused.param, refused.custom_id) == ("custom_id", None)


def test_a_line_without_custom_id_is_refused() -> None:
    raw = msgspec.json.encode({"url": CHAT_COMPLETIONS_URL, "body": {"messages": HI}})
    refused = line_refused(raw)
    assert refused.code == LineCode.MISSING_CUSTOM_ID
    assert refused.custom_id is None


def test_a_method_other_than_post_is_refused_keeping_the_custom_id() -> None:
    refused = line_refused(raw_line(custom_id="g1", method="GET"))
    assert refused.code == LineCode.UNSUPPORTED_METHOD
    assert (refused.param, refused.custom_id) == ("method", "g1")
    assert "'GET'" in refused.message


@pytest.mark.parametrize("url", ["/v1/moderations", "/v1/responses", "v1/completions", None])
def test_an_unsupported_url_is_refused_keeping_the_custom_id(url: str | None) -> None:
    refused = line_refused(raw_line(custom_id="e1", url=url))
    assert refused.code == LineCode.UNSUPPORTED_URL
    assert (refused.param, refused.custom_id) == ("url", "e1")


@pytest.mark.parametrize("body", [None, "prompt", [1, 2], 3])
def test_a_body_that_is_not_an_object_is_invalid_body(body: object) -> None:
    refused = line_refused(raw_line(custom_id="b1", body=body))
    assert refused.code == LineCode.INVALID_BODY
    assert (refused.param, refused.custom_id) == ("body", "b1")


def test_a_line_without_body_is_invalid_body() -> None:
    raw = msgspec.json.encode({"custom_id": "b1", "url": COMPLETIONS_URL})
    assert line_refused(raw).code == LineCode.INVALID_BODY


# --- to_request: completions ----------------------------------------------------------------


def test_a_text_prompt_becomes_prompt() -> None:
    req = request(completion_line(prompt="Once upon a time"))
    assert req.prompt == "Once upon a time"
    assert (req.prompt_token_ids, req.messages) == (None, None)


def test_a_prompt_of_token_ids_becomes_prompt_token_ids() -> None:
    req = request(completion_line(prompt=[101, 7592, 102]))
    assert req.prompt_token_ids == [101, 7592, 102]
    assert (req.prompt, req.messages) == (None, None)


def test_a_prompt_list_of_one_string_becomes_prompt() -> None:
    req = request(completion_line(prompt=["one string"]))
    assert req.prompt == "one string"
    assert req.prompt_token_ids is None


@pytest.mark.parametrize("prompt", [["one", "two"], [], [1, "two"]])
def test_a_prompt_that_is_not_one_prompt_is_invalid_body(prompt: list[Any]) -> None:
    refused = request_refused(completion_line(prompt=prompt))
    assert (refused.code, refused.param) == (LineCode.INVALID_BODY, "prompt")


def test_a_completion_body_without_prompt_is_invalid_body() -> None:
    line = BatchInputLine(custom_id="q1", url=COMPLETIONS_URL, body={"max_tokens": 4})
    assert request_refused(line).code == LineCode.INVALID_BODY


# --- to_request: chat -----------------------------------------------------------------------


def test_chat_messages_with_string_content_are_carried_over() -> None:
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Bye"},
    ]
    req = request(chat_line(messages=messages))
    assert req.messages == [ChatMessage(role=m["role"], content=m["content"]) for m in messages]
    assert (req.prompt, req.prompt_token_ids) == (None, None)


def test_text_parts_of_a_chat_message_are_joined() -> None:
    parts = [{"type": "text", "text": "Hello, "}, {"type": "text", "text": "world"}]
    req = request(chat_line(messages=[{"role": "user", "content": parts}]))
    assert req.messages == [ChatMessage(role="user", content="Hello, world")]


def test_an_image_part_is_an_unsupported_parameter() -> None:
    parts = [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
    ]
    refused = request_refused(chat_line(messages=[{"role": "user", "content": parts}]))
    assert (refused.code, refused.param) == (LineCode.UNSUPPORTED_PARAMETER, "messages")
    assert "image_url" in refused.message


def test_empty_messages_are_invalid_body() -> None:
    refused = request_refused(chat_line(messages=[]))
    assert (refused.code, refused.param) == (LineCode.INVALID_BODY, "messages")


# --- to_request: max tokens -----------------------------------------------------------------


@pytest.mark.parametrize("make", [chat_line, completion_line])
def test_max_tokens_becomes_max_new_tokens(make: Any) -> None:
    assert request(make(max_tokens=40)).max_new_tokens == 40


def test_max_completion_tokens_wins_over_max_tokens() -> None:
    assert request(chat_line(max_tokens=40, max_completion_tokens=7)).max_new_tokens == 7
    assert request(chat_line(max_completion_tokens=9)).max_new_tokens == 9


def test_max_completion_tokens_zero_is_refused_like_max_tokens_zero() -> None:
    assert request_refused(chat_line(max_tokens=0)).code == ErrorCode.INVALID_MAX_TOKENS
    assert request_refused(chat_line(max_completion_tokens=0)).code == (
        ErrorCode.INVALID_MAX_TOKENS
    )


@pytest.mark.parametrize("make", [chat_line, completion_line])
def test_without_max_tokens_the_wire_default_applies(make: Any) -> None:
    assert request(make()).max_new_tokens == 16


@pytest.mark.parametrize("make", [chat_line, completion_line])
def test_without_max_tokens_the_run_default_applies_when_given(make: Any) -> None:
    assert request(make(), default_max_tokens=64).max_new_tokens == 64
    assert request(make(max_tokens=5), default_max_tokens=64).max_new_tokens == 5


# --- to_request: sampling, model, ids -------------------------------------------------------


@pytest.mark.parametrize("make", [chat_line, completion_line])
def test_sampling_fields_are_carried_over(make: Any) -> None:
    req = request(make(temperature=0.7, top_p=0.9, seed=1234, stop=["\n\n", "END"], top_k=40))
    assert (req.temperature, req.top_p, req.seed, req.top_k) == (0.7, 0.9, 1234, 40)
    assert req.stop == ["\n\n", "END"]


def test_omitted_sampling_fields_keep_tokenmills_greedy_defaults() -> None:
    req = request(chat_line())
    assert (req.temperature, req.top_p, req.top_k, req.seed, req.stop) == (0.0, 1.0, 0, None, [])


def test_a_single_stop_string_becomes_a_list() -> None:
    assert request(completion_line(stop="\n")).stop == ["\n"]


def test_top_k_minus_one_means_off() -> None:
    assert request(chat_line(top_k=-1)).top_k == 0


def test_the_model_override_beats_the_body_model() -> None:
    assert request(chat_line(model="from-body")).model == "from-body"
    assert request(chat_line(model="from-body"), model="override").model == "override"
    assert request(chat_line(), model="override").model == "override"
    assert request(chat_line()).model is None


def test_the_request_carries_the_given_id_and_the_custom_id() -> None:
    req = to_request(chat_line(custom_id="capital-france"), "batch-1f2e-7")
    assert req.id == "batch-1f2e-7"
    assert req.metadata == {"custom_id": "capital-france"}


@pytest.mark.parametrize(
    ("make", "body", "param"),
    [
        (chat_line, {"stream": True}, "stream"),
        (completion_line, {"stream": True}, "stream"),
        (completion_line, {"best_of": 3}, "best_of"),
        (completion_line, {"suffix": "!"}, "suffix"),
    ],
)
def test_fields_that_would_change_the_answer_are_refused(
    make: Any, body: dict[str, Any], param: str
) -> None:
    refused = request_refused(make(**body))
    assert (refused.code, refused.param) == (LineCode.UNSUPPORTED_PARAMETER, param)
    assert param in refused.message


@pytest.mark.parametrize(
    ("make", "body"),
    [
        (chat_line, {"n": 1, "stream": False, "presence_penalty": 0, "logit_bias": {}}),
        (chat_line, {"logprobs": False, "tools": [], "response_format": {"type": "text"}}),
        (completion_line, {"echo": False, "best_of": 1, "logprobs": None}),
    ],
)
def test_the_neutral_values_of_unsupported_fields_are_accepted(
    make: Any, body: dict[str, Any]
) -> None:
    request(make(**body))


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"max_tokens": "5"}, "max_tokens"),
        ({"temperature": "hot"}, "temperature"),
        ({"stop": 5}, "stop"),
        ({"messages": "Hi"}, "messages"),
    ],
)
def test_a_field_of_the_wrong_type_is_invalid_body_naming_it(
    body: dict[str, Any], param: str
) -> None:
    refused = request_refused(chat_line(**body))
    assert (refused.code, refused.param) == (LineCode.INVALID_BODY, param)


@pytest.mark.parametrize("body", [{"temperature": -1}, {"top_p": 0}, {"stop": [""]}, {"seed": -1}])
def test_a_broken_request_rule_is_refused_with_its_error_code(body: dict[str, Any]) -> None:
    refused = request_refused(completion_line(custom_id="t1", **body))
    assert refused.code == ErrorCode.INVALID_SAMPLING_PARAMS
    assert refused.code == "invalid_sampling_params"
    assert refused.custom_id == "t1"


def test_unknown_harmless_fields_are_ignored() -> None:
    line = chat_line(user="u-42", stream_options={"include_usage": True}, store=False)
    assert request(line) == request(chat_line())


@pytest.mark.parametrize("field", ["bad_words", "functions", "some_new_field"])
def test_an_unknown_field_that_could_change_the_answer_is_refused(field: str) -> None:
    refused = request_refused(completion_line(**{field: 1}))
    assert (refused.code, refused.param) == (LineCode.UNSUPPORTED_PARAMETER, field)


def test_an_unknown_field_set_to_null_is_ignored() -> None:
    assert request(completion_line(functions=None)) == request(completion_line())


def test_stop_token_ids_are_carried_over() -> None:
    assert request(completion_line(stop_token_ids=[2, 7])).stop_token_ids == [2, 7]


# --- answer_line ----------------------------------------------------------------------------


def test_a_completion_result_answers_with_a_text_completion() -> None:
    out = as_json(answer_line("q1", COMPLETIONS_URL, ok_result(), created=1_700_000_000))
    assert out["id"].startswith("batch_req_")
    assert (out["custom_id"], out["error"]) == ("q1", None)
    response = out["response"]
    assert (response["status_code"], response["request_id"]) == (200, "batch-t-1")
    assert response["body"] == {
        "id": "cmpl-batch-t-1",
        "object": "text_completion",
        "created": 1_700_000_000,
        "model": "smollm2-135m",
        "choices": [
            {
                "index": 0,
                "text": "Hello there",
                "logprobs": None,
                "finish_reason": "length",
                "prompt_logprobs": None,  # vLLM's field, null unless asked
            }
        ],
        "usage": {
            "prompt_tokens": 3,
            "completion_tokens": 2,
            "total_tokens": 5,
            "prompt_tokens_details": {"cached_tokens": 2},
            "completion_tokens_details": {
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            },
        },
    }


def test_a_chat_result_answers_with_a_chat_completion() -> None:
    result = ok_result(text="Paris.", finish_reason=FinishReason.STOP)
    out = as_json(answer_line("capital", CHAT_COMPLETIONS_URL, result, created=1_700_000_000))
    assert out["custom_id"] == "capital"
    assert out["response"]["status_code"] == 200
    assert out["response"]["body"] == {
        "id": "chatcmpl-batch-t-1",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": "smollm2-135m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Paris."},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": 3,
            "completion_tokens": 2,
            "total_tokens": 5,
            "prompt_tokens_details": {"cached_tokens": 2},
            "completion_tokens_details": {
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            },
        },
    }


@pytest.mark.parametrize("url", [COMPLETIONS_URL, CHAT_COMPLETIONS_URL])
def test_speculations_guesses_are_openais_prediction_tokens(url: str) -> None:
    usage = Usage(
        prompt_tokens=3, completion_tokens=6, total_tokens=9,
        accepted_draft_tokens=4, rejected_draft_tokens=7,
    )  # fmt: skip
    body = as_json(answer_line("q1", url, ok_result(usage=usage)))["response"]["body"]
    assert body["usage"]["completion_tokens_details"] == {
        "accepted_prediction_tokens": 4,
        "rejected_prediction_tokens": 7,
    }


@pytest.mark.parametrize("make", [chat_line, completion_line])
def test_speculate_opts_a_line_out_of_speculative_decoding(make: Any) -> None:
    assert request(make()).speculate, "speculation is on unless the body says"
    assert request(make(speculate=True)).speculate
    assert not request(make(speculate=False)).speculate
    refused = request_refused(make(speculate="no"))
    assert (refused.code, refused.param) == (LineCode.INVALID_BODY, "speculate")


def test_created_defaults_to_now() -> None:
    body = as_json(answer_line("q1", COMPLETIONS_URL, ok_result()))["response"]["body"]
    assert isinstance(body["created"], int)
    assert body["created"] > 1_700_000_000


@pytest.mark.parametrize(
    ("code", "status", "kind"),
    [
        (ErrorCode.UNKNOWN_MODEL, 404, "invalid_request_error"),
        (ErrorCode.DEADLINE_EXCEEDED, 408, "invalid_request_error"),
        (ErrorCode.ENGINE_ERROR, 500, "server_error"),
        (ErrorCode.SHUTTING_DOWN, 503, "server_error"),
        (ErrorCode.PROMPT_TOO_LONG, 400, "invalid_request_error"),
        (ErrorCode.MAX_TOKENS_TOO_LARGE, 400, "invalid_request_error"),
    ],
)
@pytest.mark.parametrize("url", [COMPLETIONS_URL, CHAT_COMPLETIONS_URL])
def test_an_error_result_answers_with_its_status_and_an_error_body(
    code: ErrorCode, status: int, kind: str, url: str
) -> None:
    out = as_json(answer_line("q1", url, error_result(code, "it broke")))
    assert (out["custom_id"], out["error"]) == ("q1", None)
    assert out["response"] == {
        "status_code": status,
        "request_id": "batch-t-1",
        "body": {"error": {"message": "it broke", "type": kind, "param": None, "code": str(code)}},
    }


@pytest.mark.parametrize(
    "result", [ok_result(), error_result(ErrorCode.ENGINE_ERROR)], ids=["ok", "error"]
)
def test_an_answer_has_openais_batch_output_shape(result: GenerateResult) -> None:
    out = as_json(answer_line("q1", CHAT_COMPLETIONS_URL, result))
    assert set(out) == {"id", "custom_id", "response", "error"}
    assert set(out["response"]) == {"status_code", "request_id", "body"}
    assert out["error"] is None


def test_every_output_line_gets_its_own_id() -> None:
    ids = {answer_line("q1", COMPLETIONS_URL, ok_result()).id for _ in range(5)}
    assert len(ids) == 5


# --- logprobs -------------------------------------------------------------------------------

LOGPROBS = TokenLogprobs(
    tokens=["Hel", "lo"],
    token_logprobs=[-0.25, -1.5],
    top_ids=[[9, 4], [3, 6]],
    top_logprobs=[[-0.25, -2.0], [-1.0, -1.25]],
    top_tokens=[["Hel", "Hi"], ["!", "é"]],
)


@pytest.mark.parametrize("k", [0, 5, 20])
def test_completion_logprobs_become_the_requests_k(k: int) -> None:
    assert request(completion_line(logprobs=k)).logprobs == k


@pytest.mark.parametrize(
    ("body", "k"),
    [
        ({"logprobs": True, "top_logprobs": 3}, 3),
        ({"logprobs": True}, 0),
        ({"logprobs": False, "top_logprobs": 0}, None),
        ({"logprobs": False}, None),
    ],
)
def test_chat_logprobs_and_top_logprobs_become_the_requests_k(
    body: dict[str, Any], k: int | None
) -> None:
    assert request(chat_line(**body)).logprobs == k


def test_chat_top_logprobs_without_logprobs_is_refused_not_ignored() -> None:
    refused = request_refused(chat_line(top_logprobs=2))
    assert (refused.code, refused.param) == (LineCode.INVALID_BODY, "top_logprobs")


@pytest.mark.parametrize(
    ("make", "body"),
    [
        (completion_line, {"logprobs": 21}),
        (completion_line, {"logprobs": -1}),
        (chat_line, {"logprobs": True, "top_logprobs": 21}),
    ],
)
def test_more_than_20_logprobs_are_refused(make: Any, body: dict[str, Any]) -> None:
    refused = request_refused(make(custom_id="l1", **body))
    assert (refused.code, refused.custom_id) == (ErrorCode.INVALID_SAMPLING_PARAMS, "l1")
    assert "logprobs" in refused.message


def test_a_completion_answer_carries_openais_legacy_logprobs() -> None:
    result = ok_result(text="Hello", logprobs=LOGPROBS)
    choice = as_json(answer_line("q1", COMPLETIONS_URL, result))["response"]["body"]["choices"][0]
    assert choice["logprobs"] == {
        "tokens": ["Hel", "lo"],
        "token_logprobs": [-0.25, -1.5],
        # The top k, and the chosen token when it is not among them.
        "top_logprobs": [{"Hel": -0.25, "Hi": -2.0}, {"!": -1.0, "é": -1.25, "lo": -1.5}],
        "text_offset": [0, 3],
    }


def test_a_chat_answer_carries_logprobs_content() -> None:
    result = ok_result(text="Hello", logprobs=LOGPROBS)
    out = as_json(answer_line("q1", CHAT_COMPLETIONS_URL, result))
    content = out["response"]["body"]["choices"][0]["logprobs"]["content"]
    assert [c["token"] for c in content] == ["Hel", "lo"]
    assert [c["logprob"] for c in content] == [-0.25, -1.5]
    assert content[0]["bytes"] == [72, 101, 108]
    assert content[1]["top_logprobs"] == [
        {"token": "!", "logprob": -1.0, "bytes": [33]},
        {"token": "é", "logprob": -1.25, "bytes": [0xC3, 0xA9]},
    ]


@pytest.mark.parametrize("url", [COMPLETIONS_URL, CHAT_COMPLETIONS_URL])
def test_each_choice_carries_its_own_logprobs(url: str) -> None:
    other = TokenLogprobs(
        tokens=["x"], token_logprobs=[-3.0], top_ids=[[]], top_logprobs=[[]], top_tokens=[[]]
    )
    choices = [
        Choice(index=0, text="Hello", logprobs=LOGPROBS),
        Choice(index=1, text="x", logprobs=other),
    ]
    body = as_json(answer_line("q1", url, ok_result(choices=choices)))["response"]["body"]
    lengths = [
        len(c["logprobs"]["tokens" if url == COMPLETIONS_URL else "content"])
        for c in body["choices"]
    ]
    assert lengths == [2, 1]


def test_without_logprobs_the_answer_has_none(url: str = CHAT_COMPLETIONS_URL) -> None:
    body = as_json(answer_line("q1", url, ok_result()))["response"]["body"]
    assert body["choices"][0]["logprobs"] is None


# --- refusal_line ---------------------------------------------------------------------------


def test_a_refusal_has_no_response_and_an_error_with_the_line_number() -> None:
    refused = BatchLineRefused(
        LineCode.UNSUPPORTED_PARAMETER, "`n` is not supported", param="n", custom_id="q9"
    )
    out = as_json(refusal_line(refused, line_number=9))
    assert set(out) == {"id", "custom_id", "response", "error"}
    assert out["id"].startswith("batch_req_")
    assert (out["custom_id"], out["response"]) == ("q9", None)
    assert out["error"] == {
        "code": "unsupported_parameter",
        "message": "`n` is not supported",
        "line": 9,
        "param": "n",
    }


def test_a_refusal_without_custom_id_writes_null() -> None:
    out = as_json(refusal_line(line_refused(b"{oops"), line_number=3))
    assert (out["custom_id"], out["response"]) == (None, None)
    assert (out["error"]["code"], out["error"]["line"], out["error"]["param"]) == (
        "invalid_json",
        3,
        None,
    )


def test_a_refusal_for_a_broken_request_rule_writes_the_error_code() -> None:
    refused = request_refused(completion_line(custom_id="t1", temperature=-1))
    out = as_json(refusal_line(refused, line_number=2))
    assert (out["custom_id"], out["error"]["code"]) == ("t1", "invalid_sampling_params")


# --- round trip: what a resumed run reads back ----------------------------------------------


def test_output_lines_read_back_as_answered_lines() -> None:
    lines = [
        answer_line("ok", CHAT_COMPLETIONS_URL, ok_result()),
        answer_line("gone", COMPLETIONS_URL, error_result(ErrorCode.UNKNOWN_MODEL)),
        refusal_line(line_refused(raw_line(custom_id="e1", url="/v1/moderations")), line_number=5),
        refusal_line(line_refused(b"[]"), line_number=6),
    ]
    read = [_answered_decoder.decode(msgspec.json.encode(line)) for line in lines]
    assert [(a.custom_id, a.line, a.status_code) for a in read] == [
        ("ok", None, 200),
        ("gone", None, 404),
        ("e1", 5, None),
        (None, 6, None),
    ]


@pytest.mark.parametrize("field", ["n", "stream", "presence_penalty", "frequency_penalty", "echo"])
def test_an_explicit_null_means_the_default(field: str) -> None:
    assert request(completion_line(**{field: None})).prompt == "Hi"


def test_a_missing_required_field_is_named_as_the_param() -> None:
    line = BatchInputLine(custom_id="q1", url=COMPLETIONS_URL, body={"max_tokens": 3})
    refused = request_refused(line)
    assert (refused.code, refused.param) == (LineCode.INVALID_BODY, "prompt")


def test_a_json_schema_response_format_becomes_the_requests() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    body = {"type": "json_schema", "json_schema": {"name": "n", "schema": schema, "strict": True}}
    made = request(chat_line(response_format=body))
    assert made.response_format is not None
    assert made.response_format.type == "json_schema" and made.response_format.strict
    assert (
        made.response_format.schema_text()
        == '{"type":"object","properties":{"n":{"type":"integer"}},"required":["n"]}'
    )


def test_a_json_object_response_format_is_any_object() -> None:
    made = request(chat_line(response_format={"type": "json_object"}))
    assert made.response_format is not None
    assert made.response_format.schema_text() == '{"type":"object"}'


@pytest.mark.parametrize(
    "body",
    [
        {"type": "xml"},
        {"type": "json_schema"},  # no json_schema
        {"type": "json_schema", "json_schema": {"schema": "not an object"}},
        {"type": 5},
    ],
)
def test_a_malformed_response_format_is_invalid_response_format(body: dict[str, Any]) -> None:
    refused = request_refused(chat_line(response_format=body))
    assert refused.code == ErrorCode.INVALID_RESPONSE_FORMAT


# --- n choices -------------------------------------------------------------------------------


@pytest.mark.parametrize("make", [chat_line, completion_line])
def test_n_becomes_the_requests_choices(make: Any) -> None:
    assert request(make(n=4)).n == 4
    assert request(make()).n == 1


@pytest.mark.parametrize("n", [0, 17])
def test_n_out_of_range_is_refused_with_the_request_rules_code(n: int) -> None:
    refused = request_refused(chat_line(n=n))
    assert refused.code is ErrorCode.INVALID_REQUEST and "n must be in [1, 16]" in refused.message


def test_best_of_equal_to_n_is_accepted_and_larger_is_refused() -> None:
    assert request(completion_line(n=3, best_of=3)).n == 3
    refused = request_refused(completion_line(n=2, best_of=4))
    assert (refused.code, refused.param) == (LineCode.UNSUPPORTED_PARAMETER, "best_of")


def two_choices() -> GenerateResult:
    choices = [
        Choice(index=0, text="Hello there", token_ids=[1, 2], finish_reason=FinishReason.LENGTH),
        Choice(index=1, text="Hi", token_ids=[3], finish_reason=FinishReason.STOP),
    ]
    usage = Usage(prompt_tokens=3, completion_tokens=3, total_tokens=6)
    return ok_result(choices=choices, usage=usage)


def test_every_choice_is_an_output_choice_in_order() -> None:
    chat = as_json(answer_line("q1", CHAT_COMPLETIONS_URL, two_choices()))["response"]["body"]
    assert [(c["index"], c["message"]["content"], c["finish_reason"]) for c in chat["choices"]] == [
        (0, "Hello there", "length"),
        (1, "Hi", "stop"),
    ]
    assert chat["usage"]["completion_tokens"] == 3
    text = as_json(answer_line("q1", COMPLETIONS_URL, two_choices()))["response"]["body"]
    assert [(c["index"], c["text"]) for c in text["choices"]] == [(0, "Hello there"), (1, "Hi")]


# --- penalties and biases -------------------------------------------------------------------


@pytest.mark.parametrize("make", [chat_line, completion_line])
def test_penalties_and_biases_are_carried_over(make: Any) -> None:
    req = request(
        make(
            presence_penalty=0.5,
            frequency_penalty=-1.25,
            repetition_penalty=1.2,
            min_p=0.05,
            min_tokens=3,
            logit_bias={"50": -100, "7": 2.5},
        )
    )
    assert (req.presence_penalty, req.frequency_penalty, req.repetition_penalty) == (
        0.5,
        -1.25,
        1.2,
    )
    assert (req.min_p, req.min_tokens) == (0.05, 3)
    assert req.logit_bias == {50: -100.0, 7: 2.5}


def test_omitted_penalties_are_off() -> None:
    req = request(chat_line())
    assert (req.presence_penalty, req.frequency_penalty, req.repetition_penalty) == (0, 0, 1)
    assert (req.min_p, req.min_tokens, req.logit_bias) == (0, 0, {})


@pytest.mark.parametrize("key", ["a", "1.5", " 3", "", "0x10", "1" * 21])
def test_a_logit_bias_key_that_is_not_a_token_id_is_invalid_body(key: str) -> None:
    refused = request_refused(chat_line(logit_bias={key: 1}))
    assert (refused.code, refused.param) == (LineCode.INVALID_BODY, "logit_bias")


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"presence_penalty": 2.5}, ErrorCode.INVALID_SAMPLING_PARAMS),
        ({"frequency_penalty": -2.01}, ErrorCode.INVALID_SAMPLING_PARAMS),
        ({"repetition_penalty": 0}, ErrorCode.INVALID_SAMPLING_PARAMS),
        ({"min_p": 1.5}, ErrorCode.INVALID_SAMPLING_PARAMS),
        ({"min_tokens": 17}, ErrorCode.INVALID_SAMPLING_PARAMS),  # over the default 16
        ({"logit_bias": {"5": 101}}, ErrorCode.INVALID_SAMPLING_PARAMS),
        ({"logit_bias": {"-1": 1}}, ErrorCode.TOKEN_OUT_OF_VOCABULARY),
        ({"logit_bias": {str(2**31): 1}}, ErrorCode.TOKEN_OUT_OF_VOCABULARY),
    ],
)
def test_a_penalty_out_of_range_is_refused_with_its_error_code(
    body: dict[str, Any], code: ErrorCode
) -> None:
    refused = request_refused(completion_line(custom_id="p1", **body))
    assert (refused.code, refused.custom_id) == (code, "p1")


# --- prompt logprobs: echo and vLLM's prompt_logprobs ------------------------------------------

PROMPT = TokenLogprobs(
    tokens=["The", " sky", " is"],
    token_logprobs=[0.0, -3.0, -0.5],
    top_ids=[[], [11, 12, 13], [14, 15, 16]],
    top_logprobs=[[], [-1.0, -2.0, -2.5], [-0.5, -1.5, -3.0]],
    top_tokens=[[], [" sun", " sea", " day"], [" is", " was", " has"]],
    unscored_first=True,
    token_ids=[10, 99, 14],
)


def scored_result(line: BatchInputLine, **fields: Any) -> GenerateResult:
    """A result for `line`'s request, as a worker answers it (the request's metadata back)."""
    made = request(line)
    return ok_result(
        metadata=made.metadata, prompt_logprobs=PROMPT, prompt_text="The sky is", **fields
    )


def completion_choice(line: BatchInputLine, result: GenerateResult) -> dict[str, Any]:
    body = as_json(answer_line(line.custom_id, COMPLETIONS_URL, result))["response"]["body"]
    choice: dict[str, Any] = body["choices"][0]
    return choice


def test_echo_asks_the_prompts_logprobs_with_the_lines_k() -> None:
    made = request(completion_line(echo=True, logprobs=2, max_tokens=0))
    assert (made.prompt_logprobs, made.logprobs, made.max_new_tokens) == (2, 2, 0)
    # Echo without logprobs still needs the prompt's text: the prompt is scored with k = 0.
    assert request(completion_line(echo=True)).prompt_logprobs == 0
    # Both: the most either asks; each answer cuts its own.
    assert request(completion_line(echo=True, logprobs=1, prompt_logprobs=4)).prompt_logprobs == 4
    assert request(completion_line(prompt_logprobs=3)).prompt_logprobs == 3


def test_max_tokens_0_needs_prompt_logprobs() -> None:
    refused = request_refused(completion_line(max_tokens=0, logprobs=1))
    assert refused.code is ErrorCode.INVALID_MAX_TOKENS
    assert request(completion_line(max_tokens=0, prompt_logprobs=0)).max_new_tokens == 0


@pytest.mark.parametrize("k", [-1, 21])
def test_prompt_logprobs_out_of_range_are_refused(k: int) -> None:
    refused = request_refused(completion_line(prompt_logprobs=k))
    assert refused.code is ErrorCode.INVALID_SAMPLING_PARAMS
    assert "prompt_logprobs" in refused.message


def test_echo_with_logprobs_covers_the_prompt_then_the_completion() -> None:
    line = completion_line(echo=True, logprobs=2)
    choice = completion_choice(line, scored_result(line, text="Hello", logprobs=LOGPROBS))
    assert choice["text"] == "The sky isHello"
    assert choice["logprobs"] == {
        "tokens": ["The", " sky", " is", "Hel", "lo"],
        "token_logprobs": [None, -3.0, -0.5, -0.25, -1.5],
        "top_logprobs": [
            None,
            {" sun": -1.0, " sea": -2.0, " sky": -3.0},  # k = 2, and the prompt's own token
            {" is": -0.5, " was": -1.5},
            {"Hel": -0.25, "Hi": -2.0},
            {"!": -1.0, "é": -1.25, "lo": -1.5},
        ],
        "text_offset": [0, 3, 7, 10, 13],
    }
    assert choice["prompt_logprobs"] is None  # vLLM's field only when asked


def test_echo_with_max_tokens_0_is_the_prompts_logprobs_only() -> None:
    line = completion_line(echo=True, logprobs=0, max_tokens=0)
    result = scored_result(line, text="", token_ids=[], logprobs=TokenLogprobs())
    choice = completion_choice(line, result)
    assert choice["text"] == "The sky is"
    assert choice["logprobs"]["tokens"] == ["The", " sky", " is"]
    assert choice["logprobs"]["token_logprobs"] == [None, -3.0, -0.5]
    assert choice["logprobs"]["top_logprobs"] == [None, {" sky": -3.0}, {" is": -0.5}]
    assert choice["logprobs"]["text_offset"] == [0, 3, 7]


def test_echo_without_logprobs_is_the_text_only() -> None:
    line = completion_line(echo=True)
    choice = completion_choice(line, scored_result(line, text="Hello"))
    assert (choice["text"], choice["logprobs"]) == ("The sky isHello", None)


def test_vllm_prompt_logprobs_in_vllms_shape() -> None:
    line = completion_line(prompt_logprobs=2, max_tokens=0)
    choice = completion_choice(line, scored_result(line, text="", token_ids=[]))
    assert choice["text"] == ""  # no echo
    assert choice["logprobs"] is None
    assert choice["prompt_logprobs"] == [
        None,
        {
            "99": {"logprob": -3.0, "rank": None, "decoded_token": " sky"},  # not in the top 2
            "11": {"logprob": -1.0, "rank": 1, "decoded_token": " sun"},
            "12": {"logprob": -2.0, "rank": 2, "decoded_token": " sea"},
        },
        {
            "14": {"logprob": -0.5, "rank": 1, "decoded_token": " is"},
            "15": {"logprob": -1.5, "rank": 2, "decoded_token": " was"},
        },
    ]


def test_every_choice_echoes_the_requests_prompt() -> None:
    line = completion_line(echo=True, logprobs=1, n=2)
    choices = [
        Choice(index=i, text=t, token_ids=[1], finish_reason=FinishReason.LENGTH, logprobs=lp)
        for i, (t, lp) in enumerate([("A", LOGPROBS), ("B", LOGPROBS)])
    ]
    result = scored_result(line, choices=choices)
    body = as_json(answer_line("q1", COMPLETIONS_URL, result))["response"]["body"]
    assert [c["text"] for c in body["choices"]] == ["The sky isA", "The sky isB"]
    for c in body["choices"]:
        assert c["logprobs"]["tokens"][:3] == ["The", " sky", " is"]
        assert c["logprobs"]["token_logprobs"][0] is None


def test_chat_has_no_prompt_logprobs_field() -> None:
    refused = request_refused(chat_line(prompt_logprobs=1))
    assert (refused.code, refused.param) == (LineCode.UNSUPPORTED_PARAMETER, "prompt_logprobs")
