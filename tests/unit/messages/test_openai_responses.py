"""The Responses API over the chat mapping: a Responses body becomes the chat body it amounts to
(which the chat mapping takes), and a chat answer becomes a Response the `openai` SDK parses."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from openai.types.responses import Response

from messages.errors import BatchLineRefused
from messages.openai_batch import CHAT_COMPLETIONS_URL, BatchInputLine
from messages.openai_batch_answers import answer_line
from messages.openai_batch_mapping import LineCode, to_request
from messages.openai_responses import ResponsesAsked, to_chat
from messages.openai_responses_answers import to_response
from messages.result import FinishReason
from tests.unit.messages.test_openai_batch_mapping import ok_result

MODEL = "smollm2-135m"
WEATHER_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
    "additionalProperties": False,
}
WEATHER: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": WEATHER_PARAMETERS,
    "strict": True,
}


def chat_of(**body: Any) -> dict[str, Any]:
    return to_chat({"model": MODEL, **body}).chat


def refused(**body: Any) -> BatchLineRefused:
    with pytest.raises(BatchLineRefused) as caught:
        to_chat({"model": MODEL, **body})
    return caught.value


def completion(
    text: str = "Hello there", *, tool_call: bool = False, finish: FinishReason | None = None
) -> dict[str, Any]:
    """A chat.completion body as the chat door answers it (the batch answer mapping)."""
    fields = {"text": text} | ({"finish_reason": finish} if finish else {})
    line = answer_line(
        "gw-1", CHAT_COMPLETIONS_URL, ok_result(**fields), created=7, tool_call=tool_call
    )
    assert line.response is not None
    body: dict[str, Any] = msgspec.to_builtins(line.response.body)
    return body


# --- the request: a Responses body → a chat body -------------------------------------------


def test_a_text_input_is_one_user_message() -> None:
    assert chat_of(input="Hi")["messages"] == [{"role": "user", "content": "Hi"}]


def test_instructions_are_a_first_system_message() -> None:
    messages = chat_of(instructions="Be brief.", input="Hi")["messages"]
    assert messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
    ]


def test_message_items_with_text_parts_become_messages() -> None:
    given = [
        {"role": "developer", "content": "Answer in French."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
        {
            "type": "message",
            "id": "msg_1",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Bonjour", "annotations": []}],
        },
        {
            "role": "user",
            "content": [{"type": "input_text", "text": "A"}, {"type": "input_text", "text": "B"}],
        },
    ]
    assert chat_of(input=given)["messages"] == [
        {"role": "system", "content": "Answer in French."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Bonjour"},
        {"role": "user", "content": "AB"},
    ]


def test_function_calls_and_their_outputs_become_tool_calls_and_tool_messages() -> None:
    given = [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"type": "message", "role": "assistant", "content": "Let me look."},
        {
            "type": "function_call",
            "call_id": "c1",
            "name": "get_weather",
            "arguments": '{"city":"Paris"}',
        },
        {
            "type": "function_call",
            "call_id": "c2",
            "name": "get_weather",
            "arguments": '{"city":"Rome"}',
            "id": "fc_2",
            "status": "completed",
        },
        {"type": "function_call_output", "call_id": "c1", "output": "18 C"},
        {
            "type": "function_call_output",
            "call_id": "c2",
            "output": [{"type": "input_text", "text": "21 C"}],
        },
    ]
    calls = [
        {
            "id": "c1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
        },
        {
            "id": "c2",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'},
        },
    ]
    assert chat_of(input=given)["messages"] == [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"role": "assistant", "content": "Let me look.", "tool_calls": calls},
        {"role": "tool", "tool_call_id": "c1", "content": "18 C"},
        {"role": "tool", "tool_call_id": "c2", "content": "21 C"},
    ]


def test_a_function_call_after_a_user_message_is_an_assistant_turn_of_its_own() -> None:
    given = [
        {"role": "user", "content": "Weather?"},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
    ]
    assert chat_of(input=given)["messages"][1] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
        ],
    }


def test_flat_function_tools_become_chat_tools_and_a_named_choice_a_chat_one() -> None:
    chat = chat_of(
        input="Hi", tools=[WEATHER], tool_choice={"type": "function", "name": "get_weather"}
    )
    assert chat["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The weather in a city",
                "parameters": WEATHER_PARAMETERS,
                "strict": True,
            },
        }
    ]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}


def test_no_tools_drops_an_auto_choice_and_an_empty_tool_list() -> None:
    chat = chat_of(input="Hi", tools=[], tool_choice="auto", parallel_tool_calls=True)
    assert "tools" not in chat and "tool_choice" not in chat


def test_sampling_fields_map_and_max_output_tokens_is_max_completion_tokens() -> None:
    chat = chat_of(input="Hi", max_output_tokens=12, temperature=0.5, top_p=0.9, seed=3)
    assert chat["max_completion_tokens"] == 12
    assert (chat["temperature"], chat["top_p"], chat["seed"]) == (0.5, 0.9, 3)
    assert chat["model"] == MODEL and "max_output_tokens" not in chat


def test_text_format_json_schema_is_a_response_format() -> None:
    fmt = {"type": "json_schema", "name": "city", "schema": WEATHER_PARAMETERS, "strict": True}
    chat = chat_of(input="Hi", text={"format": fmt})
    assert chat["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "city", "schema": WEATHER_PARAMETERS, "strict": True},
    }
    assert chat_of(input="Hi", text={"format": {"type": "json_object"}})["response_format"] == {
        "type": "json_object"
    }
    assert "response_format" not in chat_of(input="Hi", text={"format": {"type": "text"}})


def test_fields_without_effect_here_are_accepted_and_not_passed_on() -> None:
    chat = chat_of(
        input="Hi",
        store=True,
        include=[],
        reasoning={"effort": "low"},
        truncation="auto",
        metadata={"k": "v"},
        max_tool_calls=2,
        stream=True,
    )
    assert set(chat) == {"model", "messages"}


def test_the_chat_mapping_takes_what_this_one_makes() -> None:
    chat = chat_of(
        instructions="Be brief.",
        input=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[WEATHER],
        tool_choice="required",
        max_output_tokens=40,
    )
    request = to_request(BatchInputLine(custom_id="r", url=CHAT_COMPLETIONS_URL, body=chat), "r")
    assert request.max_new_tokens == 40
    assert [m.role for m in request.messages or []] == ["system", "user"]
    assert request.response_format is not None  # the call's constraint


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        (
            {"previous_response_id": "resp_1"},
            "previous_response_id",
            LineCode.UNSUPPORTED_PARAMETER,
        ),
        ({"conversation": "conv_1"}, "conversation", LineCode.UNSUPPORTED_PARAMETER),
        ({"background": True}, "background", LineCode.UNSUPPORTED_PARAMETER),
        ({"prompt": {"id": "pmpt_1"}}, "prompt", LineCode.UNSUPPORTED_PARAMETER),
        ({"tools": [{"type": "web_search"}]}, "tools", LineCode.UNSUPPORTED_PARAMETER),
        ({"tool_choice": {"type": "file_search"}}, "tool_choice", LineCode.UNSUPPORTED_PARAMETER),
        ({"messages": [{"role": "user", "content": "Hi"}]}, "messages", LineCode.INVALID_BODY),
        ({"max_tokens": 3}, "max_tokens", LineCode.INVALID_BODY),
        ({"text": {"format": {"type": "yaml"}}}, "text", LineCode.INVALID_BODY),
        ({"max_output_tokens": "many"}, "max_output_tokens", LineCode.INVALID_BODY),
    ],
)
def test_what_cannot_be_served_is_refused_naming_the_field(
    body: dict[str, Any], param: str, code: str
) -> None:
    exc = refused(input="Hi", **body)
    assert (exc.param, exc.code) == (param, code)


@pytest.mark.parametrize(
    "item",
    [
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "item_reference", "id": "msg_1"},
        {"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]},
    ],
)
def test_input_items_other_than_text_messages_and_function_items_are_unsupported(
    item: dict[str, Any],
) -> None:
    exc = refused(input=[item])
    assert (exc.param, exc.code) == ("input", LineCode.UNSUPPORTED_PARAMETER)


@pytest.mark.parametrize(
    "given",
    [
        [],
        ["Hi"],
        [{"role": "robot", "content": "Hi"}],
        [{"type": "function_call", "name": "f", "arguments": "{}"}],
        [{"type": "function_call_output", "call_id": "c1", "output": 3}],
    ],
)
def test_malformed_input_is_an_invalid_body(given: list[Any]) -> None:
    exc = refused(input=given)
    assert (exc.param, exc.code) == ("input", LineCode.INVALID_BODY)


def test_a_body_without_input_names_it() -> None:
    assert refused().param == "input"


# --- the answer: a chat completion → a Response ---------------------------------------------


def test_a_text_answer_is_one_message_item_and_the_sdk_parses_it() -> None:
    asked = to_chat({"model": MODEL, "input": "Hi", "max_output_tokens": 2, "metadata": {"k": "v"}})
    body = to_response(asked, completion(finish=FinishReason.STOP), "resp_gw-1")
    response = Response.model_validate(body)
    assert response.output_text == "Hello there"
    assert response.status == "completed" and response.incomplete_details is None
    assert response.id == "resp_gw-1" and response.model == MODEL
    assert response.metadata == {"k": "v"} and response.max_output_tokens == 2
    [item] = response.output
    assert item.type == "message" and item.status == "completed"
    assert response.usage is not None
    assert (response.usage.input_tokens, response.usage.output_tokens) == (3, 2)
    assert response.usage.total_tokens == 5
    assert response.usage.input_tokens_details.cached_tokens == 2


def test_an_answer_cut_at_the_token_limit_is_incomplete_for_max_output_tokens() -> None:
    asked = to_chat({"model": MODEL, "input": "Hi"})
    response = Response.model_validate(
        to_response(asked, completion(finish=FinishReason.LENGTH), "resp_x")
    )
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.output[0].status == "incomplete"


def test_a_tool_call_answer_is_a_function_call_item_whose_arguments_parse() -> None:
    asked = to_chat(
        {"model": MODEL, "input": "Weather?", "tools": [WEATHER], "tool_choice": "required"}
    )
    call_text = json.dumps({"name": "get_weather", "arguments": {"city": "Paris"}})
    body = to_response(
        asked, completion(call_text, tool_call=True, finish=FinishReason.STOP), "resp_x"
    )
    response = Response.model_validate(body)
    [item] = response.output
    assert item.type == "function_call"
    assert item.name == "get_weather" and item.call_id.startswith("call_")
    assert json.loads(item.arguments) == {"city": "Paris"}
    assert response.status == "completed"
    assert response.tools[0].type == "function" and response.tool_choice == "required"


def test_an_empty_answer_is_still_a_message() -> None:
    asked = to_chat({"model": MODEL, "input": "Hi"})
    response = Response.model_validate(to_response(asked, completion(""), "resp_x"))
    assert [item.type for item in response.output] == ["message"]
    assert response.output_text == ""


def test_asked_is_a_plain_value() -> None:
    asked = to_chat({"model": MODEL, "input": "Hi", "stream": True})
    assert isinstance(asked, ResponsesAsked) and asked.stream
