"""`stream: true` answers: the workers' chunks as Server-Sent Events in OpenAI's chunk shapes.

    data: {"id": "chatcmpl-…", "object": "chat.completion.chunk", …, "choices": [{"index": 0,
           "delta": {"role": "assistant", "content": "Hel"}, "finish_reason": null}]}
    …
    data: {… "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    data: {… "choices": [], "usage": {…}}          (with stream_options.include_usage)
    data: [DONE]

`/v1/completions` streams `text_completion` objects whose choices carry `text`. Pure
functions: the text each event carries comes from `StreamCursor`, which follows the chunks of
one run (`ops.submit.assembly.StreamedText`) and the result, the authority on the text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import msgspec

from messages.chunk import GenerateChunk
from messages.openai_batch import CHAT_COMPLETIONS_URL
from messages.openai_batch_answers import token_usage
from messages.result import GenerateResult
from ops.submit.assembly import StreamedText

DONE = b"data: [DONE]\n\n"


def event(data: Any) -> bytes:
    """One SSE event carrying `data` as JSON."""
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


@dataclass
class StreamCursor:
    """What to send next: the text since the last event. The chunks of a run that is later
    run again (a worker died) are text already sent; the new run's text is sent only past it,
    and the result's past what was sent, so the client's text is the result's whenever the
    runs agree (greedy requests do)."""

    sent: str = ""
    _stream: StreamedText = field(default_factory=StreamedText)

    def add(self, chunk: GenerateChunk) -> str:
        self._stream.add(chunk)
        return self._advance(self._stream.shown)

    def finish(self, result: GenerateResult) -> str:
        return self._advance(result.text)

    def _advance(self, text: str) -> str:
        if not text.startswith(self.sent):
            return ""  # text already sent cannot be taken back
        new, self.sent = text[len(self.sent) :], text
        return new


@dataclass(frozen=True)
class ChunkShape:
    """The envelope of one streamed answer: its id, endpoint, model and creation time."""

    url: str
    request_id: str
    model: str
    created: int
    include_usage: bool = False

    @property
    def chat(self) -> bool:
        return self.url == CHAT_COMPLETIONS_URL

    def _envelope(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        if self.chat:
            head = {"id": f"chatcmpl-{self.request_id}", "object": "chat.completion.chunk"}
        else:
            head = {"id": f"cmpl-{self.request_id}", "object": "text_completion"}
        out = {**head, "created": self.created, "model": self.model, "choices": choices}
        if self.include_usage:
            out["usage"] = None  # as OpenAI: null on every chunk but the last
        return out

    def role(self) -> bytes:
        """Chat's first event: the assistant's role, no text yet (none for completions)."""
        delta = {"role": "assistant", "content": ""}
        return event(self._envelope([self._choice(delta=delta)]))

    def text(self, text: str) -> bytes:
        if self.chat:
            return event(self._envelope([self._choice(delta={"content": text})]))
        return event(self._envelope([self._choice(text=text)]))

    def finish(self, finish_reason: str) -> bytes:
        if self.chat:
            return event(self._envelope([self._choice(delta={}, finish_reason=finish_reason)]))
        return event(self._envelope([self._choice(text="", finish_reason=finish_reason)]))

    def usage(self, result: GenerateResult) -> bytes:
        """The last event with `stream_options.include_usage`: no choices, the usage."""
        out = self._envelope([])
        out["usage"] = msgspec.to_builtins(token_usage(result))
        return event(out)

    def _choice(self, finish_reason: str | None = None, **content: Any) -> dict[str, Any]:
        return {"index": 0, **content, "logprobs": None, "finish_reason": finish_reason}


def error_event(body: Any) -> bytes:
    """An error after the stream began (the status is sent): `data: {"error": …}`, which the
    `openai` SDKs raise as an `APIError`."""
    return event(body)
