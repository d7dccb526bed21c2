"""The Responses door's framing: chat SSE data read back, Responses events written as OpenAI
sends them (`event:` then `data:`)."""

from __future__ import annotations

import json

from ops.gateway.responses import chat_chunks, sse
from ops.gateway.sse import DONE, event


def test_chat_chunks_reads_every_data_line_and_skips_done() -> None:
    data = event({"a": 1}) + event({"b": 2}) + DONE
    assert chat_chunks(data) == [{"a": 1}, {"b": 2}]
    assert chat_chunks(DONE) == []


def test_sse_names_the_event_type_then_its_data() -> None:
    written = sse({"type": "response.output_text.delta", "sequence_number": 3, "delta": "Hi"})
    head, data, end = written.decode().split("\n", 2)
    assert head == "event: response.output_text.delta"
    assert json.loads(data.removeprefix("data: "))["delta"] == "Hi"
    assert end == "\n"
