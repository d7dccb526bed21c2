"""Regex, choice, Lark/GBNF grammar and tool-call constraints on the real SmolLM2, all in one
continuous batch beside an unconstrained request: each output that stops is in its language,
checked without the grammar library (a regex's `re.fullmatch`, the choice list, a small parser
of the grammar's language, `jsonschema` for a call's arguments)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import msgspec
import pytest

from gpu.engine import Engine, EngineRequest
from gpu.engine_config import EngineConfig
from gpu.loading.loader import LoadedModel, load_model
from gpu.sequence import Constraint, SamplingParams
from messages.openai_tools import NamedTool, Tool, parse_tool_call, tool_call_format
from ops.models.offline import run_all

DATE = r"(19|20)[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
ZIP = r"[0-9]{5}"
ANSWERS = ["yes", "no", "it depends"]
# Nested lists of numbers: context-free (no regex checks it), and read back by json.loads.
NESTED = r"""
start: list
list: "[" [value ("," value)*] "]"
value: NUMBER | list
NUMBER: /[0-9]{1,3}/
"""
SENTENCE = 'root ::= ("The sky is " | "Grass is ") ("blue" | "green" | "red") "."'
WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 40},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"timezone": {"type": "string", "maxLength": 40}},
            "required": ["timezone"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [WEATHER, TIME]
NAMED = {"type": "function", "function": {"name": "get_time"}}


@pytest.fixture(scope="module")
def smollm2(smollm2_path: Path) -> LoadedModel:
    return load_model(smollm2_path, name="smollm2-135m")


def chat(model: LoadedModel, text: str) -> list[int]:
    prompt = model.tokenizer.apply_chat_template([{"role": "user", "content": text}])
    return model.tokenizer.encode(prompt, add_special_tokens=False)


def is_nested_list(value: Any) -> bool:
    if isinstance(value, list):
        return all(is_nested_list(v) for v in value)
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 999


def tool_constraint(choice: Any) -> Constraint:
    given: str | NamedTool = msgspec.convert(choice, str | NamedTool)
    shape = tool_call_format(msgspec.convert(TOOLS, list[Tool]), given)
    assert shape is not None
    schema = shape.schema_text()
    assert schema is not None
    return Constraint.json(schema, shape.strict)


def test_every_kind_on_smollm2(smollm2: LoadedModel) -> None:
    asks: dict[str, tuple[str, Constraint | None]] = {
        "date": ("When did the Berlin Wall fall? Answer with the date.", Constraint("regex", DATE)),
        "zip": ("Give me a US zip code.", Constraint("regex", ZIP)),
        "choice": ("Is it going to rain tomorrow?", Constraint("choice", json.dumps(ANSWERS))),
        "lark": ("Write a nested list of numbers, like [1,[2,3]].", Constraint("grammar", NESTED)),
        "gbnf": ("Say something about colours.", Constraint("grammar", SENTENCE)),
        "required": ("What is the weather in Paris, in celsius?", tool_constraint("required")),
        "named": ("I am in Tokyo.", tool_constraint(NAMED)),
        "plain": ("Name a colour.", None),
    }  # fmt: skip
    requests = [
        EngineRequest(name, chat(smollm2, text), SamplingParams(max_new_tokens=48, constraint=c))
        for name, (text, c) in asks.items()
    ]
    done = {c.request_id: c for c in run_all(Engine(smollm2, EngineConfig()), requests).completions}
    for name in asks.keys() - {"plain"}:
        assert done[name].finish_reason == "stop", (name, done[name].text)
    text = {name: completion.text for name, completion in done.items()}
    assert re.fullmatch(DATE, text["date"]) and re.fullmatch(ZIP, text["zip"])
    assert text["choice"] in ANSWERS
    assert is_nested_list(json.loads(text["lark"])), text["lark"]
    assert re.fullmatch(r"(The sky is |Grass is )(blue|green|red)\.", text["gbnf"])
    parameters = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    for name, only in (("required", None), ("named", "get_time")):
        call = parse_tool_call(text[name])
        assert call is not None, text[name]
        assert (
            call.function.name == (only or call.function.name) and call.function.name in parameters
        )
        jsonschema.validate(json.loads(call.function.arguments), parameters[call.function.name])
