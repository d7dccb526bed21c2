"""Streamed answers in OpenAI's chunk shapes, and the text each event carries."""

from __future__ import annotations

import json

from messages.chunk import GenerateChunk
from messages.openai_batch import CHAT_COMPLETIONS_URL, COMPLETIONS_URL
from messages.result import FinishReason, GenerateResult, Usage
from ops.gateway.sse import DONE, ChunkShape, StreamCursor


def data(event: bytes) -> dict:
    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    return json.loads(event[6:])


def test_chat_chunks_carry_deltas_then_a_finish_then_usage() -> None:
    shape = ChunkShape(CHAT_COMPLETIONS_URL, "r1", "smollm2-135m", 7, include_usage=True)
    first, text = data(shape.role()), data(shape.text("Hel"))
    assert first["object"] == "chat.completion.chunk" and first["id"] == "chatcmpl-r1"
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert text["choices"][0] == {
        "index": 0, "delta": {"content": "Hel"}, "logprobs": None, "finish_reason": None
    }  # fmt: skip
    assert text["usage"] is None
    finish = data(shape.finish("stop"))["choices"][0]
    assert finish["delta"] == {} and finish["finish_reason"] == "stop"
    result = GenerateResult(
        id="r1",
        usage=Usage(
            prompt_tokens=3, completion_tokens=2, total_tokens=5, cached_tokens=1,
            accepted_draft_tokens=1, rejected_draft_tokens=2,
        ),
    )  # fmt: skip
    usage = data(shape.usage(result))
    assert usage["choices"] == []
    assert usage["usage"] == {
        "prompt_tokens": 3,
        "completion_tokens": 2,
        "total_tokens": 5,
        "prompt_tokens_details": {"cached_tokens": 1},
        "completion_tokens_details": {
            "accepted_prediction_tokens": 1,
            "rejected_prediction_tokens": 2,
        },
    }


def test_completion_chunks_are_text_completions() -> None:
    shape = ChunkShape(COMPLETIONS_URL, "r2", "m", 7)
    event = data(shape.text(" Paris"))
    assert event["object"] == "text_completion" and event["id"] == "cmpl-r2"
    assert event["choices"][0]["text"] == " Paris"
    assert "usage" not in event
    assert data(shape.finish("length"))["choices"][0]["finish_reason"] == "length"


def test_done_ends_the_stream() -> None:
    assert DONE == b"data: [DONE]\n\n"


def chunk(seq: int, text: str, run: str = "a") -> GenerateChunk:
    return GenerateChunk(id="r", run=run, seq=seq, text=text)


def test_the_cursor_sends_each_text_once_in_order() -> None:
    cursor = StreamCursor()
    assert cursor.add(chunk(0, "The")) == "The"
    assert cursor.add(chunk(2, " is")) == ""  # waits for seq 1
    assert cursor.add(chunk(1, " sky")) == " sky is"
    assert cursor.add(chunk(1, " sky")) == ""  # a duplicate
    result = GenerateResult(id="r", text="The sky is blue", finish_reason=FinishReason.STOP)
    assert cursor.finish(result) == " blue"


def test_a_run_again_sends_only_past_what_was_sent() -> None:
    cursor = StreamCursor()
    assert cursor.add(chunk(0, "The sky")) == "The sky"
    assert cursor.add(chunk(0, "The", run="b")) == ""
    assert cursor.add(chunk(1, " sky is", run="b")) == " is"
    assert cursor.finish(GenerateResult(id="r", text="The sky is")) == ""
