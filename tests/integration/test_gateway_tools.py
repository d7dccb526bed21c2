"""Tool calling through the gateway with the official `openai` SDK: a real broker and a real
SmolLM2 worker, whose chat template has no tool format (tokenmill's default format).

SmolLM2-135M does not decide to call a tool by itself, however explicit the prompt (tried:
a direct order, a worked example of an earlier call in the history): it describes the call
in prose. So the agent loop's first turn asks for the call with `tool_choice: "required"`; the
turns after it leave `tool_choice` out ("auto"), with the tools still given, the assistant's
`tool_calls` message and the `tool` result in the history, as every agent sends them.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from tests.integration.gateway_fleet import MODEL, Fleet, client, gateway

pytestmark = pytest.mark.slow

WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 20},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}


async def test_an_agent_loop_calls_a_tool_sends_the_result_back_and_answers(
    fleet: Fleet,
) -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "What is the weather in Paris? Use the get_weather tool."}
    ]
    async with gateway(fleet) as url, client(url) as sdk:
        first = await sdk.chat.completions.create(
            model=MODEL, messages=messages, tools=[WEATHER], tool_choice="required", max_tokens=60
        )
        (choice,) = first.choices
        assert choice.finish_reason == "tool_calls"
        assert choice.message.tool_calls
        (call,) = choice.message.tool_calls
        assert call.id.startswith("call_") and call.function.name == "get_weather"
        jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
        turns = 1
        while True:
            # The assistant's message as the SDK gave it, then each call's result.
            messages.append(choice.message.model_dump(exclude_none=True))
            for each in choice.message.tool_calls or []:
                result = {"city": json.loads(each.function.arguments).get("city"), "sky": "sunny"}
                messages.append(
                    {"role": "tool", "tool_call_id": each.id, "content": json.dumps(result)}
                )
            answer = await sdk.chat.completions.create(
                model=MODEL, messages=messages, tools=[WEATHER], max_tokens=60
            )  # tool_choice omitted: "auto"
            turns += 1
            (choice,) = answer.choices
            if choice.finish_reason != "tool_calls":
                break
            for each in choice.message.tool_calls or []:  # an auto call: valid, always
                arguments = json.loads(each.function.arguments)
                jsonschema.validate(arguments, WEATHER["function"]["parameters"])
            assert turns < 6, "the model kept calling"
    assert turns >= 2 and len(messages) >= 3
    assert choice.message.tool_calls is None
    assert choice.message.content and choice.finish_reason in ("stop", "length")


async def test_auto_without_a_call_is_a_plain_text_answer(fleet: Fleet) -> None:
    async with gateway(fleet) as url, client(url) as sdk:
        answer = await sdk.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Say hello."}],
            tools=[WEATHER],
            tool_choice="auto",
            parallel_tool_calls=False,
            max_tokens=20,
        )
    (choice,) = answer.choices
    assert choice.message.content and choice.message.tool_calls is None
    assert choice.finish_reason in ("stop", "length")


async def test_legacy_functions_are_answered_as_a_function_call(fleet: Fleet) -> None:
    async with gateway(fleet) as url, client(url) as sdk:
        answer = await sdk.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Weather in Oslo, in celsius?"}],
            functions=[WEATHER["function"]],
            function_call={"name": "get_weather"},
            max_tokens=60,
        )
    (choice,) = answer.choices
    assert choice.finish_reason == "function_call"
    assert choice.message.function_call is not None
    assert choice.message.function_call.name == "get_weather"
    jsonschema.validate(
        json.loads(choice.message.function_call.arguments), WEATHER["function"]["parameters"]
    )
