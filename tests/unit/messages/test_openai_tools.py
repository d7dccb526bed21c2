"""Chat tools: tool_choice "required" or a named function constrains the answer to a call
(a JSON schema of name and arguments); "none" ignores the tools; "auto" is refused; the answer
comes back as OpenAI's tool_calls."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import msgspec
import pytest

from messages.error_codes import ErrorCode
from messages.errors import InvalidRequest
from messages.limits import MAX_TOOLS
from messages.openai_batch import CHAT_COMPLETIONS_URL, COMPLETIONS_URL, BatchInputLine
from messages.openai_batch_answers import answer_line
from messages.openai_batch_mapping import LineCode, calls_tool
from messages.openai_chat_tools import TOOLS_KEY
from messages.openai_tools import FunctionDef, Tool, call_schema, parse_tool_call
from messages.request import ChatMessage, GenerateRequest, ToolCalling
from messages.response_format import ResponseFormat
from messages.result import Choice, FinishReason, ModelRef
from messages.validation import check_request
from tests.unit.messages.test_openai_batch_mapping import (
    chat_line,
    ok_result,
    request,
    request_refused,
)

WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"enum": ["C", "F"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
        "strict": True,
    },
}
# Parameters that refer to their own definitions, as pydantic writes them.
BOOKING: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "book-room",
        "parameters": {
            "type": "object",
            "properties": {"guest": {"$ref": "#/$defs/Guest"}, "nights": {"type": "integer"}},
            "required": ["guest", "nights"],
            "$defs": {
                "Guest": {
                    "type": "object",
                    "properties": {"name": {"type": "string"}},
                    "required": ["name"],
                }
            },
        },
    },
}
NO_PARAMETERS: dict[str, Any] = {"type": "function", "function": {"name": "ping"}}
TOOLS = [WEATHER, BOOKING, NO_PARAMETERS]


def schema_of(**body: Any) -> dict[str, Any]:
    shape = request(chat_line(**body)).response_format
    assert shape is not None and shape.json_schema is not None
    assert shape.json_schema.schema is not None
    return shape.json_schema.schema


GOOD_CALLS: list[dict[str, Any]] = [
    {"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}},
    {"name": "book-room", "arguments": {"guest": {"name": "Ada"}, "nights": 2}},
    {"name": "ping", "arguments": {}},
]
BAD_CALLS: list[dict[str, Any]] = [
    {"name": "get_weather", "arguments": {"city": "Paris"}},  # missing unit
    {"name": "book-room", "arguments": {"guest": {}, "nights": 2}},  # the $ref'd rule
    {"name": "ping", "arguments": {"x": 1}},
    {"name": "nope", "arguments": {}},
    {"name": "ping"},
    {"name": "ping", "arguments": {}, "extra": 1},
]


def test_required_allows_a_call_of_any_tool_and_nothing_else() -> None:
    schema = schema_of(tools=TOOLS, tool_choice="required")
    jsonschema.Draft202012Validator.check_schema(schema)
    for call in GOOD_CALLS:
        jsonschema.validate(call, schema)
    for call in BAD_CALLS:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(call, schema)


def test_a_named_function_allows_only_its_calls() -> None:
    named = {"type": "function", "function": {"name": "book-room"}}
    schema = schema_of(tools=TOOLS, tool_choice=named)
    jsonschema.validate(GOOD_CALLS[1], schema)
    for call in (GOOD_CALLS[0], GOOD_CALLS[2], BAD_CALLS[1]):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(call, schema)


def test_the_call_schema_puts_the_name_first_and_strict_only_when_every_tool_is() -> None:
    req = request(chat_line(tools=[WEATHER], tool_choice="required"))
    assert req.response_format is not None and req.response_format.json_schema is not None
    assert req.response_format.strict
    schema = req.response_format.json_schema.schema
    assert schema is not None and list(schema["properties"]) == ["name", "arguments"]
    mixed = request(chat_line(tools=[WEATHER, NO_PARAMETERS], tool_choice="required"))
    assert mixed.response_format is not None and not mixed.response_format.strict


def test_references_move_with_the_parameters_and_the_tool_is_not_changed() -> None:
    function = msgspec.convert(BOOKING["function"], FunctionDef)
    schema = call_schema([function, function])
    guest = schema["anyOf"][1]["properties"]["arguments"]["properties"]["guest"]
    assert guest == {"$ref": "#/anyOf/1/properties/arguments/$defs/Guest"}
    single = call_schema([function])["properties"]["arguments"]["properties"]["guest"]
    assert single == {"$ref": "#/properties/arguments/$defs/Guest"}
    assert function.parameters is not None
    assert function.parameters["properties"]["guest"] == {"$ref": "#/$defs/Guest"}


def test_earlier_turns_calls_and_tool_results_are_carried_for_the_template() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "ping", "arguments": "{}"}}
    history = [
        {"role": "user", "content": "Ping it."},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "content": "pong", "tool_call_id": "call_1"},
    ]
    req = request(chat_line(messages=history, tools=TOOLS))
    assert req.messages is not None
    assistant, tool = req.messages[1], req.messages[2]
    assert assistant.content == "" and assistant.tool_calls is not None
    assert assistant.tool_calls[0].function.name == "ping"
    assert assistant.for_template()["tool_calls"][0]["function"]["arguments"] == {}
    assert (tool.role, tool.content, tool.tool_call_id) == ("tool", "pong", "call_1")


def test_tool_choice_none_ignores_the_tools() -> None:
    req = request(chat_line(tools=TOOLS, tool_choice="none"))
    assert req.response_format is None and req.structured_output is None


@pytest.mark.parametrize("body", [{"tools": TOOLS}, {"tools": TOOLS, "tool_choice": "auto"}])
def test_auto_carries_the_tools_and_lets_the_model_call_in_its_format(
    body: dict[str, Any],
) -> None:
    req = request(chat_line(**body))
    assert req.tools is not None
    assert [t.function.name for t in req.tools if t.function] == [
        t["function"]["name"] for t in TOOLS
    ]
    assert req.tool_calling == ToolCalling(parallel=True)
    assert req.response_format is None and req.structured_output is None
    assert req.metadata[TOOLS_KEY] == "auto"
    single = request(chat_line(**body, parallel_tool_calls=False))
    assert single.tool_calling == ToolCalling(parallel=False)


def test_auto_and_another_constraint_are_refused() -> None:
    shape = {"type": "json_object"}
    refused = request_refused(chat_line(tools=TOOLS, response_format=shape))
    assert refused.code == ErrorCode.INVALID_RESPONSE_FORMAT
    assert "at most one constraint" in refused.message


def test_required_still_forces_one_json_call_and_shows_the_tools() -> None:
    req = request(chat_line(tools=TOOLS, tool_choice="required"))
    assert req.tools is not None and req.tool_calling is None
    assert req.response_format is not None and req.metadata[TOOLS_KEY] == "required"


def test_legacy_functions_are_read_as_tools() -> None:
    functions = [WEATHER["function"]]
    req = request(chat_line(functions=functions))
    assert req.tools is not None and req.tool_calling == ToolCalling(parallel=False)
    assert req.metadata[TOOLS_KEY] == "auto+functions"
    named = request(chat_line(functions=functions, function_call={"name": "get_weather"}))
    assert named.response_format is not None
    assert request(chat_line(functions=functions, function_call="none")).tools is None
    refused = request_refused(chat_line(functions=functions, tools=TOOLS))
    assert refused.param == "functions"
    history = [
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": None,
            "function_call": {"name": "get_weather", "arguments": "{}"},
        },
        {"role": "function", "name": "get_weather", "content": "sunny"},
    ]
    turns = request(chat_line(messages=history, functions=functions)).messages
    assert turns is not None and turns[1].tool_calls and turns[2].role == "tool"


@pytest.mark.parametrize(
    ("body", "code", "param", "words"),
    [
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "x"}}},
         LineCode.INVALID_BODY, "tool_choice", "not a function in `tools`"),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, LineCode.INVALID_BODY, "tool_choice",
         "must be"),
        ({"tool_choice": "required"}, LineCode.INVALID_BODY, "tool_choice", "needs `tools`"),
        ({"tools": [{"type": "custom", "custom": {}}], "tool_choice": "required"},
         LineCode.UNSUPPORTED_PARAMETER, "tools", "only function tools"),
        ({"tools": [{"type": "function", "function": {"name": "a b"}}],
          "tool_choice": "required"}, LineCode.INVALID_BODY, "tools", "a-z, A-Z, 0-9"),
        ({"tools": [NO_PARAMETERS, NO_PARAMETERS], "tool_choice": "required"},
         LineCode.INVALID_BODY, "tools", "two tools are named 'ping'"),
        ({"tools": [NO_PARAMETERS] * (MAX_TOOLS + 1), "tool_choice": "required"},
         LineCode.INVALID_BODY, "tools", f"at most {MAX_TOOLS} tools"),
        ({"tools": [{"type": "function", "function": {"name": 5}}], "tool_choice": "required"},
         LineCode.INVALID_BODY, "tools", "Expected `str`"),
        ({"tools": [NO_PARAMETERS], "tool_choice": "required", "guided_regex": "a"},
         ErrorCode.INVALID_RESPONSE_FORMAT, "guided_regex", "found: tools, guided_regex"),
    ],
)  # fmt: skip
def test_malformed_tools_are_refused(
    body: dict[str, Any], code: str, param: str, words: str
) -> None:
    refused = request_refused(chat_line(**body))
    assert (refused.code, refused.param) == (code, param)
    assert words in refused.message


def test_only_chat_lines_with_tools_and_a_choice_are_calls() -> None:
    assert calls_tool(chat_line(tools=TOOLS, tool_choice="required"))
    assert calls_tool(chat_line(tools=TOOLS, tool_choice={"type": "function"}))
    assert not calls_tool(chat_line(tools=TOOLS, tool_choice="none"))
    assert not calls_tool(chat_line(tools=[], tool_choice="required"))
    assert not calls_tool(chat_line())
    line = BatchInputLine(custom_id="c", url=COMPLETIONS_URL, body={"prompt": "Hi"})
    assert not calls_tool(line)


# -- the answer -----------------------------------------------------------------------------


def chat_answer(result: Any, tool_call: bool = True) -> dict[str, Any]:
    line = answer_line("q1", CHAT_COMPLETIONS_URL, result, tool_call=tool_call)
    body: dict[str, Any] = json.loads(msgspec.json.encode(line))["response"]["body"]
    return body


def test_a_whole_call_is_answered_as_tool_calls() -> None:
    text = '{"name":"get_weather","arguments":{"city":"Zürich","unit":"C"}}'
    (choice,) = chat_answer(ok_result(text=text))["choices"]
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["role"] == "assistant" and message["content"] is None
    (call,) = message["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "get_weather"
    arguments = call["function"]["arguments"]
    assert isinstance(arguments, str)
    assert json.loads(arguments) == {"city": "Zürich", "unit": "C"}


def test_a_cut_off_call_is_its_text_with_length() -> None:
    text = '{"name":"get_weather","argu'
    result = ok_result(text=text, finish_reason=FinishReason.LENGTH)
    (choice,) = chat_answer(result)["choices"]
    assert choice["finish_reason"] == "length"
    assert choice["message"] == {"role": "assistant", "content": text}


def test_each_of_n_choices_is_parsed_alone() -> None:
    whole = '{"name":"ping","arguments":{}}'
    choices = [
        Choice(index=0, text=whole, token_ids=[1], finish_reason=FinishReason.STOP),
        Choice(index=1, text='{"name":"pi', token_ids=[2], finish_reason=FinishReason.LENGTH),
    ]
    first, second = chat_answer(ok_result(text=whole, choices=choices))["choices"]
    assert first["finish_reason"] == "tool_calls" and first["message"]["tool_calls"]
    assert second["finish_reason"] == "length" and "tool_calls" not in second["message"]


def test_without_tool_call_the_answer_has_no_tool_calls_key() -> None:
    text = '{"name":"ping","arguments":{}}'
    result = ok_result(text=text, finish_reason=FinishReason.STOP)
    (choice,) = chat_answer(result, tool_call=False)["choices"]
    assert choice["message"] == {"role": "assistant", "content": text}
    assert choice["finish_reason"] == "stop"


NOT_CALLS = ["", "[1]", '{"name": 3, "arguments": {}}', '{"name": "f", "arguments": 1}']


@pytest.mark.parametrize("text", [*NOT_CALLS, "[" * 10**5])
def test_text_that_is_not_a_call_parses_to_none(text: str) -> None:
    assert parse_tool_call(text) is None


# -- answers under "auto" -------------------------------------------------------------------


def auto_result(text: str, fmt: str = "", asked: str = "auto", **fields: Any) -> Any:
    model = ModelRef(name="m", digest="d", tool_format=fmt)
    return ok_result(
        text=text, model=model, metadata={TOOLS_KEY: asked}, finish_reason=FinishReason.STOP
    )


def test_an_auto_answer_with_calls_gives_them_and_the_text_before() -> None:
    text = (
        'I will check.\n<tool_call>{"name":"get_weather","arguments":{"city":"Oslo","unit":"C"}}'
        '</tool_call>\n<tool_call>{"name":"ping","arguments":{}}</tool_call>'
    )
    (choice,) = chat_answer(auto_result(text))["choices"]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "I will check."
    names = [c["function"]["name"] for c in choice["message"]["tool_calls"]]
    assert names == ["get_weather", "ping"]
    ids = {c["id"] for c in choice["message"]["tool_calls"]}
    assert len(ids) == 2 and all(i.startswith("call_") for i in ids)


def test_an_auto_answer_in_text_is_plain_text() -> None:
    (choice,) = chat_answer(auto_result("It is sunny."))["choices"]
    assert choice["message"] == {"role": "assistant", "content": "It is sunny."}
    assert choice["finish_reason"] == "stop"


def test_an_auto_answer_is_read_in_the_models_format() -> None:
    text = '{"name":"get_weather","parameters":{"city":"Oslo","unit":"F"}}'
    (choice,) = chat_answer(auto_result(text, "llama3_json"))["choices"]
    (call,) = choice["message"]["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == {"city": "Oslo", "unit": "F"}
    assert choice["message"]["content"] is None


def test_a_legacy_functions_answer_is_a_function_call() -> None:
    text = '<tool_call>{"name":"ping","arguments":{}}</tool_call>'
    (choice,) = chat_answer(auto_result(text, asked="auto+functions"))["choices"]
    assert choice["finish_reason"] == "function_call"
    assert choice["message"]["function_call"] == {"name": "ping", "arguments": "{}"}
    assert "tool_calls" not in choice["message"]


def test_the_door_checks_the_tool_fields_of_a_request() -> None:
    tools = [msgspec.convert(WEATHER, Tool)]
    chat = [ChatMessage(role="user", content="Hi")]
    check_request(GenerateRequest(messages=chat, tools=tools, tool_calling=ToolCalling()))
    cases = [
        (GenerateRequest(messages=chat, tool_calling=ToolCalling()), "needs `tools`"),
        (GenerateRequest(prompt="Hi", tools=tools), "need `messages`"),
        (
            GenerateRequest(
                messages=chat,
                tools=tools,
                tool_calling=ToolCalling(),
                response_format=ResponseFormat(type="json_object"),
            ),
            "at most one constraint",
        ),
        (
            GenerateRequest(messages=chat, tools=[msgspec.convert(NO_PARAMETERS, Tool)] * 2),
            "two tools are named",
        ),
    ]
    for request_, words in cases:
        with pytest.raises(InvalidRequest, match=words):
            check_request(request_)
