"""Structured output through a real broker and the real SmolLM2: JSON-schema requests
interleaved with ordinary ones, a schema the grammar library cannot compile and a malformed
`response_format`. Every request is answered exactly once, every constrained output that
stops validates against its schema, and the ordinary outputs are those of `tokenmill
generate`."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from gpu.engine import Engine
from gpu.engine_config import EngineConfig
from gpu.loading.loader import load_model
from messages.error_codes import ErrorCode
from messages.request import ChatMessage, GenerateRequest
from messages.response_format import JsonSchemaFormat, ResponseFormat
from messages.result import FinishReason
from tests.integration.pipeline import new_lane, produce, results_by_id, running_worker
from tests.integration.test_batch import (
    batch_run,
    chat,
    completion,
    output_lines,
    worker,
    write_jsonl,
)
from tests.integration.test_roundtrip import MAX_NEW, expected_tokens

pytestmark = pytest.mark.slow

SCHEMAS: dict[str, dict[str, Any]] = {
    "city": {
        "type": "object",
        "properties": {
            "continent": {"enum": ["Africa", "Americas", "Asia", "Europe", "Oceania"]},
            "capital": {"type": "boolean"},
            "rank": {"type": "integer", "minimum": 1, "maximum": 99},
        },
        "required": ["continent", "capital", "rank"],
        "additionalProperties": False,
    },
    "code": {
        "type": "object",
        "properties": {
            "airport": {"type": "string", "pattern": "^[A-Z]{3}$"},
            "gates": {"type": "array", "items": {"enum": ["A", "B", "C"]}, "maxItems": 2},
        },
        "required": ["airport", "gates"],
        "additionalProperties": False,
    },
    "nested": {
        "type": "object",
        "properties": {
            "where": {
                "type": "object",
                "properties": {"north": {"type": "boolean"}, "zone": {"enum": [1, 2, 3]}},
                "required": ["north", "zone"],
                "additionalProperties": False,
            }
        },
        "required": ["where"],
        "additionalProperties": False,
    },
}
PLAIN = ["Tell me about Kafka.", "What is the moon?", "Three words for tea:"]


def json_schema(schema: dict[str, Any]) -> ResponseFormat:
    return ResponseFormat(
        type="json_schema", json_schema=JsonSchemaFormat(name="x", schema=schema, strict=True)
    )


def ask(request_id: str, text: str, **fields: Any) -> GenerateRequest:
    return GenerateRequest(
        id=request_id, messages=[ChatMessage(role="user", content=text)], **fields
    )


async def test_schemas_among_ordinary_requests(kafka_bootstrap, smollm2_path, tmp_path) -> None:
    requests = []
    for i, name in enumerate(SCHEMAS):
        requests.append(GenerateRequest(id=f"plain-{i}", prompt=PLAIN[i], max_new_tokens=MAX_NEW))
        requests.append(
            ask(f"json-{name}", f"Answer in JSON about a {name}.", max_new_tokens=40,
                response_format=json_schema(SCHEMAS[name]))
        )  # fmt: skip
    uncompilable = json_schema({"type": "string", "pattern": "(?<=a)b"})
    requests += [
        ask("any-object", "Describe Paris as JSON.", max_new_tokens=24,
            response_format=ResponseFormat(type="json_object")),
        ask("cut-short", "Answer in JSON.", max_new_tokens=3,
            response_format=json_schema(SCHEMAS["city"])),
        ask("uncompilable", "Hi", response_format=uncompilable),
        ask("malformed", "Hi", response_format=ResponseFormat(type="yaml")),
    ]  # fmt: skip
    lane = await new_lane(kafka_bootstrap, partitions=2)
    await produce(lane.bootstrap, lane.requests, requests)

    engine = Engine(load_model(smollm2_path, name="smollm2-135m"), EngineConfig())
    async with running_worker(lane.worker_config(), engine):
        found = await results_by_id(lane, [r.id for r in requests], within_s=600)

    assert {r.id: len(found.get(r.id, [])) for r in requests} == {r.id: 1 for r in requests}
    result = {rid: results[0] for rid, results in found.items()}
    for name, schema in SCHEMAS.items():
        answer = result[f"json-{name}"]
        assert answer.error is None and answer.finish_reason == FinishReason.STOP, answer
        jsonschema.validate(json.loads(answer.text), schema)
    anything = result["any-object"]
    if anything.finish_reason == FinishReason.STOP:
        assert isinstance(json.loads(anything.text), dict)
    else:
        assert anything.finish_reason == FinishReason.LENGTH and anything.text.startswith("{")
    cut = result["cut-short"]
    assert cut.finish_reason == FinishReason.LENGTH and cut.usage.completion_tokens == 3
    with pytest.raises(json.JSONDecodeError):
        json.loads(cut.text)
    for rid in ("uncompilable", "malformed"):
        assert result[rid].error is not None
        assert result[rid].error.code == ErrorCode.INVALID_RESPONSE_FORMAT, result[rid]
    expected = expected_tokens(smollm2_path, PLAIN, chat=False, tmp=tmp_path)
    for i, tokens in enumerate(expected):
        assert result[f"plain-{i}"].token_ids == tokens


async def test_openai_batch_lines_with_response_format(
    kafka_bootstrap: str, smollm2_path: Path, tmp_path: Path
) -> None:
    schema = SCHEMAS["city"]
    shaped = {"type": "json_schema", "json_schema": {"name": "city", "schema": schema}}
    source = write_jsonl(
        tmp_path / "in.jsonl",
        [
            chat("city", "A city, as JSON.", max_tokens=40, response_format=shaped),
            chat("plain", "Name a color.", max_tokens=4),
            chat("bad", "Hi", response_format={"type": "json_schema"}),
        ],
    )
    out = tmp_path / "out.jsonl"
    lane = await new_lane(kafka_bootstrap)
    async with worker(lane, tmp_path / "worker.log") as process:
        done = await asyncio.to_thread(batch_run, lane, str(source), "-o", str(out), "--json")
        assert process.terminate() == 0
    assert done.returncode == 0, done.stderr[-3000:]
    lines = {line["custom_id"]: line for line in output_lines(out)}
    assert set(lines) == {"city", "plain", "bad"}
    (choice,) = lines["city"]["response"]["body"]["choices"]
    assert choice["finish_reason"] == "stop"
    jsonschema.validate(json.loads(choice["message"]["content"]), schema)
    assert lines["plain"]["error"] is None
    assert lines["bad"]["error"]["code"] == "invalid_response_format"


DATE = r"(19|20)[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
ANSWERS = ["yes", "no", "it depends"]
NESTED = (
    'start: list\nlist: "[" [value ("," value)*] "]"\nvalue: NUMBER | list\nNUMBER: /[0-9]{1,3}/'
)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
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
CONSTRAINED_LINES = [
    chat("regex", "When did the Berlin Wall fall? Answer with the date.", max_tokens=16,
         guided_regex=DATE),
    chat("choice", "Is it going to rain tomorrow?", max_tokens=6,
         structured_outputs={"choice": ANSWERS}),
    completion("grammar", "A nested list of numbers: ", max_tokens=32, guided_grammar=NESTED),
    chat("json", "A city, as JSON.", max_tokens=40,
         structured_outputs={"json": SCHEMAS["city"]}),
    chat("tool", "What is the weather in Paris, in celsius?", max_tokens=40, tools=[WEATHER],
         tool_choice="required"),
    chat("two", "Hi", guided_regex="a+", guided_choice=["a"]),
    chat("auto", "Hi", tools=[WEATHER]),
    chat("uncompilable", "Hi", guided_regex="(?<=a)b"),
]  # fmt: skip


async def test_openai_batch_lines_with_regex_choice_grammar_and_tools(
    kafka_bootstrap: str, smollm2_path: Path, tmp_path: Path
) -> None:
    """Through `tokenmill batch run` and a worker: each output in its language, each the
    engine's own answer to the same line run directly, and the refusals where they belong."""
    from tests.integration.test_openai_fields import direct_bodies

    source = write_jsonl(tmp_path / "in.jsonl", CONSTRAINED_LINES)
    out = tmp_path / "out.jsonl"
    lane = await new_lane(kafka_bootstrap)
    async with worker(lane, tmp_path / "worker.log") as process:
        done = await asyncio.to_thread(batch_run, lane, str(source), "-o", str(out), "--json")
        assert process.terminate() == 0
    assert done.returncode == 0, done.stderr[-3000:]
    lines = {line["custom_id"]: line for line in output_lines(out)}
    assert set(lines) == {line["custom_id"] for line in CONSTRAINED_LINES}
    served = {}
    for name in ("regex", "choice", "grammar", "json", "tool"):
        assert lines[name]["error"] is None, lines[name]
        (choice,) = lines[name]["response"]["body"]["choices"]
        served[name] = choice
    assert re.fullmatch(DATE, served["regex"]["message"]["content"])
    assert served["choice"]["message"]["content"] in ANSWERS
    assert isinstance(json.loads(served["grammar"]["text"]), list)
    jsonschema.validate(json.loads(served["json"]["message"]["content"]), SCHEMAS["city"])
    tool = served["tool"]
    assert tool["finish_reason"] == "tool_calls" and tool["message"]["content"] is None
    (call,) = tool["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    arguments = json.loads(call["function"]["arguments"])
    jsonschema.validate(arguments, WEATHER["function"]["parameters"])  # type: ignore[index]
    assert lines["two"]["error"]["code"] == "invalid_response_format"
    (auto,) = lines["auto"]["response"]["body"]["choices"]  # tool_choice "auto": answered
    assert auto["message"]["content"] or auto["message"]["tool_calls"]
    refused = lines["uncompilable"]["response"]
    assert refused["status_code"] == 400
    assert refused["body"]["error"]["code"] == "invalid_response_format"

    answered = [line for line in CONSTRAINED_LINES if line["custom_id"] in served]
    direct = await asyncio.to_thread(direct_bodies, smollm2_path, answered)
    for name in ("regex", "choice", "grammar", "json"):
        assert [served[name]] == direct[name]["choices"], name
    (alone,) = direct["tool"]["choices"]  # answered as text there: the same call
    assert json.loads(alone["message"]["content"]) == {
        "name": "get_weather",
        "arguments": arguments,
    }
