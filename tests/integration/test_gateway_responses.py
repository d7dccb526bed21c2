"""`POST /v1/responses` with the official `openai` SDK against a real broker and a SmolLM2
worker: a Response's text is the chat answer to the same messages, streamed or not, and a
function tool's call comes back as a `function_call` item."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from messages.openai_batch import CHAT_COMPLETIONS_URL
from tests.integration.gateway_fleet import MODEL, Fleet, client, direct_text, gateway

pytestmark = pytest.mark.slow

QUESTION = "What is the capital of France?"
# temperature 0: the answer is the greedy one whatever the omitted temperature defaults to
ASKED: dict[str, Any] = {"model": MODEL, "max_output_tokens": 12, "temperature": 0}
CHAT: dict[str, Any] = {"model": MODEL, "max_completion_tokens": 12, "temperature": 0}
WEATHER: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}


async def test_a_response_is_the_chat_answer_plain_and_streamed(fleet: Fleet) -> None:
    messages = [{"role": "user", "content": QUESTION}]
    want = await direct_text(fleet, CHAT_COMPLETIONS_URL, {**CHAT, "messages": messages})
    async with gateway(fleet) as base, client(base) as api:
        response = await api.responses.create(input=QUESTION, **ASKED)
        assert response.object == "response" and response.model == MODEL
        assert response.output_text == want
        assert response.usage is not None and response.usage.output_tokens > 0
        cut = response.usage.output_tokens == 12
        assert response.status == ("incomplete" if cut else "completed")

        events = [
            event
            async for event in await api.responses.create(input=QUESTION, stream=True, **ASKED)
        ]
        assert events[0].type == "response.created"
        assert [e.sequence_number for e in events] == list(range(len(events)))
        deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
        assert "".join(deltas) == want
        last = events[-1]
        assert last.type == ("response.incomplete" if cut else "response.completed")
        assert last.response.output_text == want
        assert last.response.usage is not None
        assert last.response.usage.output_tokens == response.usage.output_tokens


async def test_the_sdk_stream_helper_assembles_the_response(fleet: Fleet) -> None:
    """`responses.stream` wants `response.completed`: asked for a few tokens past a short
    answer's end, so it ends by itself."""
    ask = {**ASKED, "max_output_tokens": 64}
    messages = [{"role": "user", "content": "Say hello."}]
    want = await direct_text(
        fleet, CHAT_COMPLETIONS_URL, {**CHAT, "max_completion_tokens": 64, "messages": messages}
    )
    async with gateway(fleet) as base, client(base) as api:
        async with api.responses.stream(input="Say hello.", **ask) as stream:
            kinds = [event.type async for event in stream]
            if kinds[-1] != "response.completed":
                pytest.skip("the answer ran to the token limit: no response.completed to assemble")
            final = await stream.get_final_response()
        assert final.output_text == want


async def test_instructions_and_a_multi_item_input_are_the_chat_conversation(
    fleet: Fleet,
) -> None:
    instructions = "You answer in one short sentence."
    items: list[Any] = [
        {"role": "user", "content": "Hello!"},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Hi! How can I help?", "annotations": []}],
        },
        {"role": "user", "content": [{"type": "input_text", "text": QUESTION}]},
    ]
    messages = [
        {"role": "system", "content": instructions},
        {"role": "user", "content": "Hello!"},
        {"role": "assistant", "content": "Hi! How can I help?"},
        {"role": "user", "content": QUESTION},
    ]
    want = await direct_text(fleet, CHAT_COMPLETIONS_URL, {**CHAT, "messages": messages})
    async with gateway(fleet) as base, client(base) as api:
        response = await api.responses.create(instructions=instructions, input=items, **ASKED)
        assert response.output_text == want
        assert response.instructions == instructions


async def call_weather(api: openai.AsyncOpenAI) -> Any:
    return await api.responses.create(
        input="What is the weather in Paris?",
        tools=[WEATHER],
        tool_choice="required",
        **{**ASKED, "max_output_tokens": 40},
    )


async def test_a_required_function_tool_is_a_function_call_item(fleet: Fleet) -> None:
    async with gateway(fleet) as base, client(base) as api:
        response = await call_weather(api)
        [call] = response.output
        assert call.type == "function_call" and call.name == "get_weather"
        assert isinstance(json.loads(call.arguments)["city"], str)
        assert response.status == "completed"

        stream = await api.responses.create(
            input="What is the weather in Paris?",
            tools=[WEATHER],
            tool_choice="required",
            stream=True,
            **{**ASKED, "max_output_tokens": 40},
        )
        events = [event async for event in stream]
        done = [e for e in events if e.type == "response.function_call_arguments.done"]
        assert [json.loads(e.arguments) for e in done] == [json.loads(call.arguments)]
        assert events[-1].type == "response.completed"


async def test_a_function_call_output_sent_back_is_answered(fleet: Fleet) -> None:
    async with gateway(fleet) as base, client(base) as api:
        first = await call_weather(api)
        [call] = first.output
        assert call.type == "function_call"
        turn = [
            {"role": "user", "content": "What is the weather in Paris?"},
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": call.name,
                "arguments": call.arguments,
            },
            {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 C"},
        ]
        second = await api.responses.create(
            input=turn, tools=[WEATHER], tool_choice="none", **ASKED
        )
        assert second.output_text


async def test_a_stored_response_is_refused_naming_the_field(fleet: Fleet) -> None:
    async with gateway(fleet) as base, client(base) as api:
        with pytest.raises(openai.BadRequestError) as caught:
            await api.responses.create(input=QUESTION, previous_response_id="resp_1", **ASKED)
        assert caught.value.code == "unsupported_parameter"
        assert caught.value.param == "previous_response_id"
