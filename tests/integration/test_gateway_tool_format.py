"""An agent loop under tool_choice "auto" through the gateway, with the official `openai` SDK,
on a real broker and a worker running a tiny model whose chat template has a Hermes tool
format (`<tool_call>` blocks, as Qwen's): every turn leaves `tool_choice` out.

The model has random weights: `logit_bias` on its `<tool_call>` token steers the first turn to
open a call (the grammar alone then makes the call valid against the tool's schema); the
second turn, with the call and its result in the history and no bias, answers in text
(greedy: random weights sampled could open a call as well). The loop runs once answered whole
and once streamed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from tokenizers import Tokenizer

from tests.integration.gateway_fleet import Fleet, client, gateway, serving
from tests.tool_templates import FORECAST, build_tool_checkpoint

pytestmark = pytest.mark.slow

MODEL = "tiny-tools"


@pytest.fixture(scope="module")
def tiny_fleet(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """One worker serving the tiny Hermes-format model, with cancel and events topics."""
    folder = tmp_path_factory.mktemp("tools-fleet")
    checkpoint = build_tool_checkpoint(folder / MODEL)
    with serving(kafka_bootstrap, str(checkpoint), folder) as served:
        yield served


def trigger_token(fleet: Fleet) -> int:
    """The tiny model's `<tool_call>` token id (a `logit_bias` on it opens a call)."""
    tokenizer = Tokenizer.from_file(str(Path(fleet.worker.model) / "tokenizer.json"))
    return int(tokenizer.token_to_id("<tool_call>"))


async def test_an_auto_agent_loop_on_a_model_with_a_tool_format(
    tiny_fleet: Fleet, tmp_path: Path
) -> None:
    trigger = trigger_token(tiny_fleet)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Weather in Oslo, 3 days?"}]
    async with gateway(tiny_fleet) as url, client(url) as sdk:
        first = await sdk.chat.completions.create(
            model=MODEL,
            messages=messages,
            tools=[FORECAST],  # tool_choice omitted: "auto"
            parallel_tool_calls=False,
            logit_bias={str(trigger): 100},
            max_tokens=80,
        )
        (choice,) = first.choices
        assert choice.finish_reason == "tool_calls", choice
        assert choice.message.tool_calls
        (call,) = choice.message.tool_calls
        assert call.id.startswith("call_") and call.function.name == "forecast"
        arguments = json.loads(call.function.arguments)
        jsonschema.validate(arguments, FORECAST["function"]["parameters"])

        messages.append(choice.message.model_dump(exclude_none=True))
        messages.append({"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"})
        second = await sdk.chat.completions.create(
            model=MODEL, messages=messages, tools=[FORECAST], max_tokens=20, temperature=0
        )
        (final,) = second.choices
        assert final.finish_reason in ("stop", "length")
        assert final.message.tool_calls is None and final.message.content
        messages.append({"role": "assistant", "content": final.message.content})
        messages.append({"role": "user", "content": "Thanks. And Rome?"})
        third = await sdk.chat.completions.create(
            model=MODEL, messages=messages, tools=[FORECAST], max_tokens=20, temperature=0
        )
        assert third.choices[0].message.content or third.choices[0].message.tool_calls


async def test_the_same_loop_streamed_gives_the_call_in_pieces_then_text(tiny_fleet: Fleet) -> None:
    trigger = trigger_token(tiny_fleet)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Weather in Lima, 2 days?"}]
    async with gateway(tiny_fleet) as url, client(url) as sdk:
        stream = await sdk.chat.completions.create(
            model=MODEL,
            messages=messages,
            tools=[FORECAST],
            parallel_tool_calls=False,
            logit_bias={str(trigger): 100},
            max_tokens=80,
            stream=True,
        )
        ids, names, arguments, finish = [], [], [], None
        async for chunk in stream:
            for choice in chunk.choices:
                for piece in choice.delta.tool_calls or []:
                    assert piece.index == 0
                    if piece.id:
                        ids.append(piece.id)
                    if piece.function and piece.function.name:
                        names.append(piece.function.name)
                    if piece.function and piece.function.arguments:
                        arguments.append(piece.function.arguments)
                finish = choice.finish_reason or finish
        assert finish == "tool_calls" and names == ["forecast"] and len(ids) == 1
        called = json.loads("".join(arguments))
        jsonschema.validate(called, FORECAST["function"]["parameters"])

        call = {"id": ids[0], "type": "function"}
        call["function"] = {"name": "forecast", "arguments": "".join(arguments)}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": ids[0], "content": "rain, 15 C"})
        stream = await sdk.chat.completions.create(
            model=MODEL,
            messages=messages,
            tools=[FORECAST],
            max_tokens=20,
            temperature=0,
            stream=True,
        )
        texts, finish = [], None
        async for chunk in stream:
            for choice in chunk.choices:
                assert not choice.delta.tool_calls
                texts.append(choice.delta.content or "")
                finish = choice.finish_reason or finish
        assert finish in ("stop", "length") and "".join(texts)
