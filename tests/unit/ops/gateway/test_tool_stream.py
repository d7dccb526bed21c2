"""A constrained tool call's JSON text streamed as tool-call pieces: however it is split."""

from __future__ import annotations

import json

import pytest

from messages.openai_tools import parse_tool_call
from ops.gateway.tool_stream import CallText

CALLS = [
    '{"name": "get_weather", "arguments": {"city": "Paris"}}',
    '{ "name" : "f\\u00e9", "arguments" : { "q" : [1, 2.5, {"a": "x\\"} y"}], "b": null } }',
    '{"name":"noop","arguments":{}}',
]


@pytest.mark.parametrize("text", CALLS)
@pytest.mark.parametrize("size", [1, 2, 3, 7, 1000])
def test_the_pieces_are_the_call_whatever_the_split(text: str, size: int) -> None:
    call = CallText("call_x")
    pieces = [p for i in range(0, len(text), size) for p in call.pieces(text[i : i + size])]
    head, *rest = pieces
    whole = parse_tool_call(text)
    assert whole is not None
    assert head == {
        "index": 0, "id": "call_x", "type": "function",
        "function": {"name": whole.function.name, "arguments": ""},
    }  # fmt: skip
    arguments = "".join(p["function"]["arguments"] for p in rest)
    assert json.loads(arguments) == json.loads(whole.function.arguments)
    assert call.text == text


def test_nothing_goes_before_the_name_is_whole() -> None:
    call = CallText()
    assert call.pieces('{"name": "get_') == []
    assert not call.started
    assert call.pieces('weather", "arguments": {"a"')[0]["function"]["name"] == "get_weather"
