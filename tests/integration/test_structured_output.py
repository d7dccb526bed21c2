"""Structured output through a real broker and the real SmolLM2: JSON-schema requests
interleaved with ordinary ones, a schema the grammar library cannot compile and a malformed
`response_format`. Every request is answered exactly once, every constrained output that
stops validates against its schema, and the ordinary outputs are those of `tokenmill
generate`."""

from __future__ import annotations

import asyncio
import json
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
from tests.integration.test_batch import batch_run, chat, output_lines, worker, write_jsonl
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
