"""vLLM's extras and OpenAI's defaults through the batch mapper: which wire field each body
field becomes, what only the answer needs (in metadata), and the answers they shape."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from messages.error_codes import ErrorCode
from messages.errors import BatchLineRefused
from messages.openai_batch import CHAT_COMPLETIONS_URL, COMPLETIONS_URL, BatchInputLine
from messages.openai_batch_answers import answer_line
from messages.openai_batch_mapping import (
    REQUEST_ID_KEY,
    TOKENS_AS_IDS_KEY,
    LineCode,
    to_request,
    unknown_fields,
)
from messages.request import GenerateRequest
from messages.result import Choice, FinishReason, GenerateResult, TokenLogprobs, Usage
from messages.validation import check_request

HI = [{"role": "user", "content": "Hi"}]


def chat_line(**body: Any) -> BatchInputLine:
    return BatchInputLine(custom_id="q1", url=CHAT_COMPLETIONS_URL, body={"messages": HI, **body})


def completion_line(**body: Any) -> BatchInputLine:
    return BatchInputLine(custom_id="q1", url=COMPLETIONS_URL, body={"prompt": "Hi", **body})


def request(line: BatchInputLine, **kw: Any) -> GenerateRequest:
    return to_request(line, "batch-t-1", **kw)


def refused(line: BatchInputLine, **kw: Any) -> BatchLineRefused:
    with pytest.raises(BatchLineRefused) as info:
        to_request(line, "batch-t-1", **kw)
    return info.value


@pytest.mark.parametrize("line_of", [chat_line, completion_line])
def test_the_output_extras_become_wire_fields(line_of: Any) -> None:
    asked = request(
        line_of(ignore_eos=True, skip_special_tokens=False, include_stop_str_in_output=True)
    )
    assert (asked.ignore_eos, asked.skip_special_tokens, asked.include_stop_str_in_output) == (
        True,
        False,
        True,
    )


def test_the_output_extras_default_off() -> None:
    asked = request(completion_line())
    assert not asked.ignore_eos and asked.skip_special_tokens
    assert not asked.include_stop_str_in_output and asked.truncate_prompt_tokens is None


@pytest.mark.parametrize("k", [1, 7, -1])
def test_truncate_prompt_tokens_is_carried(k: int) -> None:
    assert request(completion_line(truncate_prompt_tokens=k)).truncate_prompt_tokens == k


@pytest.mark.parametrize("k", [0, -2])
def test_a_truncation_that_is_no_count_is_refused(k: int) -> None:
    assert refused(completion_line(truncate_prompt_tokens=k)).code == ErrorCode.INVALID_REQUEST


@pytest.mark.parametrize(("vllm", "wire"), [(0, 0), (-5, 5), (10, -10)])
def test_vllm_s_priority_lower_first_becomes_the_wire_s_larger_first(vllm: int, wire: int) -> None:
    assert request(chat_line(priority=vllm)).priority == wire


def test_a_priority_out_of_the_wire_s_range_is_refused() -> None:
    assert refused(chat_line(priority=1000)).code == ErrorCode.INVALID_REQUEST


def test_request_id_names_the_answer_and_the_wire_id_stays_the_caller_s() -> None:
    asked = request(chat_line(request_id="client-7"))
    assert asked.id == "batch-t-1"  # no client can collide with another's request
    assert asked.metadata[REQUEST_ID_KEY] == "client-7"
    result = GenerateResult(
        id=asked.id, text="ok", finish_reason=FinishReason.STOP, metadata=asked.metadata
    )
    body = msgspec.to_builtins(answer_line("q1", CHAT_COMPLETIONS_URL, result).response)["body"]
    assert body["id"] == "chatcmpl-client-7"


def test_request_id_beside_echo_keeps_both_in_metadata() -> None:
    asked = request(completion_line(request_id="r", echo=True, return_tokens_as_token_ids=True))
    assert asked.metadata[REQUEST_ID_KEY] == "r" and asked.metadata[TOKENS_AS_IDS_KEY] == "1"
    assert "openai.echo" in asked.metadata and asked.metadata["custom_id"] == "q1"


def test_the_chat_template_extras_become_wire_fields() -> None:
    asked = request(chat_line(chat_template_kwargs={"enable_thinking": False}))
    assert asked.chat_template_kwargs == {"enable_thinking": False}
    assert asked.add_generation_prompt and not asked.continue_final_message
    opened = request(chat_line(continue_final_message=True))
    assert opened.continue_final_message and not opened.add_generation_prompt
    assert not request(chat_line(add_generation_prompt=False)).add_generation_prompt


def test_continuing_the_last_message_with_a_generation_prompt_is_refused() -> None:
    line = chat_line(continue_final_message=True, add_generation_prompt=True)
    assert refused(line).code == ErrorCode.INVALID_REQUEST


def test_the_chat_template_extras_are_chat_s_only() -> None:
    assert unknown_fields(completion_line(chat_template_kwargs={})) == ("chat_template_kwargs",)
    assert refused(completion_line(chat_template_kwargs={"x": 1})).param == "chat_template_kwargs"


def test_unknown_fields_are_refused_unless_ignored() -> None:
    line = chat_line(frobnicate=1, user="u", nothing=None)
    assert unknown_fields(line) == ("frobnicate",)
    assert (refused(line).code, refused(line).param) == (
        LineCode.UNSUPPORTED_PARAMETER,
        "frobnicate",
    )
    assert request(line, ignore_unknown=True).messages is not None


def test_a_known_field_of_the_wrong_type_is_refused_even_when_ignoring_unknown_ones() -> None:
    line = chat_line(ignore_eos="yes", frobnicate=1)
    assert refused(line, ignore_unknown=True).param == "ignore_eos"


# --- defaults: the wire's, or OpenAI's ---------------------------------------------------------


def test_without_openai_defaults_omitted_fields_are_the_wire_s() -> None:
    asked = request(chat_line())
    assert asked.model_defaults == []
    assert (asked.max_new_tokens, asked.temperature, asked.top_p, asked.top_k) == (16, 0.0, 1.0, 0)


def test_with_openai_defaults_a_chat_leaves_its_length_and_sampling_to_the_model() -> None:
    asked = request(chat_line(), openai_defaults=True)
    assert asked.model_defaults == ["max_new_tokens", "temperature", "top_p", "top_k"]
    check_request(asked)


def test_with_openai_defaults_completions_keep_16_tokens() -> None:
    asked = request(completion_line(top_k=5), openai_defaults=True)
    assert asked.model_defaults == ["temperature", "top_p"]
    assert asked.max_new_tokens == 16 and asked.top_k == 5


def test_max_completion_tokens_is_a_given_length() -> None:
    asked = request(chat_line(max_completion_tokens=7), openai_defaults=True)
    assert "max_new_tokens" not in asked.model_defaults and asked.max_new_tokens == 7


def test_a_default_max_tokens_sets_an_omitted_one_before_the_model_would() -> None:
    asked = request(chat_line(), openai_defaults=True, default_max_tokens=200)
    assert asked.max_new_tokens == 200 and "max_new_tokens" not in asked.model_defaults


def test_model_defaults_naming_another_field_is_refused() -> None:
    bad = GenerateRequest(id="x", prompt="p", model_defaults=["max_new_tokens", "seed"])
    with pytest.raises(Exception, match="model_defaults"):
        check_request(bad)


# --- return_tokens_as_token_ids ----------------------------------------------------------------

LOGPROBS = TokenLogprobs(
    tokens=["Hel", "lo"],
    token_logprobs=[-0.25, -1.5],
    top_ids=[[9, 4], [3, 6]],
    top_logprobs=[[-0.25, -2.0], [-1.0, -1.25]],
    top_tokens=[["Hel", "Hi"], ["!", "é"]],
)


def scored(line: BatchInputLine) -> dict[str, Any]:
    asked = request(line)
    result = GenerateResult(
        id=asked.id,
        text="Hello",
        token_ids=[9, 3],
        finish_reason=FinishReason.LENGTH,
        logprobs=LOGPROBS,
        usage=Usage(prompt_tokens=1, completion_tokens=2, total_tokens=3),
        metadata=asked.metadata,
    )
    body: dict[str, Any] = msgspec.to_builtins(answer_line("q1", line.url, result).response)["body"]
    return body


def test_chat_logprob_tokens_as_token_ids() -> None:
    line = chat_line(logprobs=True, top_logprobs=2, return_tokens_as_token_ids=True)
    body = scored(line)
    content = body["choices"][0]["logprobs"]["content"]
    assert [c["token"] for c in content] == ["token_id:9", "token_id:3"]
    assert [t["token"] for t in content[1]["top_logprobs"]] == ["token_id:3", "token_id:6"]
    assert body["choices"][0]["message"]["content"] == "Hello"  # the text stays text


def test_completion_logprob_tokens_as_token_ids() -> None:
    body = scored(completion_line(logprobs=1, return_tokens_as_token_ids=True))
    logprobs = body["choices"][0]["logprobs"]
    assert logprobs["tokens"] == ["token_id:9", "token_id:3"]
    assert logprobs["top_logprobs"][0] == {"token_id:9": -0.25, "token_id:4": -2.0}


def test_without_the_flag_logprob_tokens_are_texts() -> None:
    body = scored(completion_line(logprobs=1))
    assert body["choices"][0]["logprobs"]["tokens"] == ["Hel", "lo"]


def test_every_choice_s_tokens_are_ids() -> None:
    line = chat_line(logprobs=True, n=2, return_tokens_as_token_ids=True)
    asked = request(line)
    choices = [Choice(index=i, text="Hello", token_ids=[9, 3], logprobs=LOGPROBS) for i in range(2)]
    result = GenerateResult(
        id=asked.id, finish_reason=FinishReason.LENGTH, choices=choices, metadata=asked.metadata
    )
    body = msgspec.to_builtins(answer_line("q1", line.url, result).response)["body"]
    for choice in body["choices"]:
        assert choice["logprobs"]["content"][0]["token"] == "token_id:9"
