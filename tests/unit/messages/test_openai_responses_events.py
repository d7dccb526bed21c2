"""Streamed Responses: chat chunks become the Responses events in OpenAI's order, numbered,
each one an event the `openai` SDK parses."""

from __future__ import annotations

import json
from typing import Any

import pydantic
import pytest
from openai.types.responses import Response, ResponseStreamEvent

from messages.openai_responses import to_chat
from messages.openai_responses_events import ResponseEvents, replayed

MODEL = "smollm2-135m"
_events_adapter: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(ResponseStreamEvent)


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta or {}, "logprobs": None, "finish_reason": finish}
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "model": MODEL,
        "choices": [choice],
    }


USAGE = {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7}
USAGE_CHUNK = {"id": "chatcmpl-1", "model": MODEL, "choices": [], "usage": USAGE}


def streamed(chunks: list[dict[str, Any]], **body: Any) -> list[dict[str, Any]]:
    """Every event of a stream of `chunks`, each checked against the SDK's event types."""
    asked = to_chat({"model": MODEL, "input": "Hi", **body})
    events = ResponseEvents(asked, "resp_gw-1", 7, MODEL)
    out = events.start()
    for one in chunks:
        out += events.chunk(one)
    if not any(e["type"] == "error" for e in out):
        out += events.finish()
    for event in out:
        _events_adapter.validate_python(json.loads(json.dumps(event)))
    return out


def kinds(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


def test_a_text_stream_is_one_message_with_its_deltas_then_completed() -> None:
    events = streamed(
        [
            chunk({"role": "assistant", "content": ""}),
            chunk({"content": "Hel"}),
            chunk({"content": "lo"}),
            chunk({}, finish="stop"),
            USAGE_CHUNK,
        ]
    )
    assert kinds(events) == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert (
        "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == "Hello"
    )
    item_ids = {e["item_id"] for e in events if "item_id" in e}
    assert len(item_ids) == 1
    final = Response.model_validate(events[-1]["response"])
    assert final.output_text == "Hello" and final.status == "completed"
    assert final.usage is not None and final.usage.total_tokens == 7
    assert Response.model_validate(events[0]["response"]).status == "in_progress"


def test_a_stream_cut_at_the_token_limit_ends_incomplete() -> None:
    events = streamed([chunk({"content": "Hel"}), chunk({}, finish="length"), USAGE_CHUNK])
    assert events[-1]["type"] == "response.incomplete"
    final = Response.model_validate(events[-1]["response"])
    assert final.status == "incomplete" and final.incomplete_details is not None
    assert final.incomplete_details.reason == "max_output_tokens"
    done = next(e for e in events if e["type"] == "response.output_item.done")
    assert done["item"]["status"] == "incomplete"


def test_streamed_tool_calls_are_function_call_items_with_argument_deltas() -> None:
    first = {
        "index": 0,
        "id": "call_a",
        "type": "function",
        "function": {"name": "get_weather", "arguments": ""},
    }
    second = {
        "index": 1,
        "id": "call_b",
        "type": "function",
        "function": {"name": "get_time", "arguments": "{}"},
    }
    events = streamed(
        [
            chunk({"role": "assistant", "content": None, "tool_calls": [first]}),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city":'}}]}),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}),
            chunk({"tool_calls": [second]}),
            chunk({}, finish="tool_calls"),
            USAGE_CHUNK,
        ]
    )
    assert kinds(events)[2:] == [
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    final = Response.model_validate(events[-1]["response"])
    calls = [
        (i.call_id, i.name, json.loads(i.arguments))
        for i in final.output
        if i.type == "function_call"
    ]
    assert calls == [("call_a", "get_weather", {"city": "Paris"}), ("call_b", "get_time", {})]
    done = [e for e in events if e["type"] == "response.function_call_arguments.done"]
    assert [e["output_index"] for e in done] == [0, 1]


def test_an_empty_answer_streams_an_empty_message() -> None:
    events = streamed([chunk({"role": "assistant", "content": ""}), chunk({}, finish="stop")])
    assert "response.output_item.added" in kinds(events)
    assert Response.model_validate(events[-1]["response"]).output_text == ""


def test_an_error_chunk_is_an_error_event_then_response_failed() -> None:
    error = {
        "error": {
            "message": "no result within 5 s",
            "type": "server_error",
            "param": None,
            "code": "timeout",
        }
    }
    events = streamed([chunk({"content": "Hel"}), error])
    assert kinds(events)[-2:] == ["error", "response.failed"]
    assert events[-2]["code"] == "timeout" and events[-2]["message"] == "no result within 5 s"
    failed = Response.model_validate(events[-1]["response"])
    assert failed.status == "failed" and failed.error is not None
    assert failed.error.code == "server_error"


@pytest.mark.parametrize("tool_call", [False, True])
def test_a_whole_answer_replays_as_the_chunks_that_stream_it(tool_call: bool) -> None:
    message: dict[str, Any] = {"role": "assistant", "content": "Hello"}
    finish = "stop"
    if tool_call:
        call = {
            "id": "call_a",
            "type": "function",
            "function": {"name": "f", "arguments": '{"x":1}'},
        }
        message, finish = {"role": "assistant", "content": None, "tool_calls": [call]}, "tool_calls"
    completion = {
        "id": "chatcmpl-1",
        "model": MODEL,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": USAGE,
    }
    final = Response.model_validate(streamed(replayed(completion))[-1]["response"])
    if tool_call:
        assert [(i.type, getattr(i, "arguments", None)) for i in final.output] == [
            ("function_call", '{"x":1}')
        ]
    else:
        assert final.output_text == "Hello"
    assert final.usage is not None and final.usage.output_tokens == 3
