"""`stream: true` answers: the workers' chunks as Server-Sent Events in OpenAI's chunk shapes.

    data: {"id": "chatcmpl-…", "object": "chat.completion.chunk", …, "choices": [{"index": 0,
           "delta": {"role": "assistant", "content": ""}, "finish_reason": null, …}]}
    data: {… "choices": [{"index": 0, "delta": {"content": "Hel"}, "logprobs": {…}, …}]}
    …
    data: {… "choices": [{"index": 0, "delta": {"content": "lo"}, …, "finish_reason": "stop"}]}
    data: {… "choices": [], "usage": {…}}          (with stream_options.include_usage)
    data: [DONE]

`/v1/completions` streams `text_completion` objects whose choices carry `text` (and logprobs in
the completions shape). Each choice of a request with `n` > 1 streams under its `index`.

The last event of a choice carries its `finish_reason` together with its last text: each
choice's newest character is held back until the next chunk or the result, so the finish never
comes as an event of its own with no text, except for an answer with no text at all (then, as
OpenAI sends it, chat's `delta` is `{}` and a completion's `text` "").

A chunk's logprobs go out with the first event that carries text after them (an event never
has logprobs and no text), so the events' logprobs add up to the answer's. A constrained tool
call (`tool_choice` "required" or named) streams as `delta.tool_calls` pieces (through
`ToolText`: `ops.gateway.tool_stream.CallText`). Pure: `StreamEvents` turns replies into
event bytes, no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec

from messages.chunk import GenerateChunk
from messages.openai_batch import CHAT_COMPLETIONS_URL
from messages.openai_batch_answers import (
    openai_finish_reason,
    result_choices,
    stream_logprobs,
    token_usage,
)
from messages.result import Choice, GenerateResult, TokenLogprobs
from ops.submit.assembly import StreamedText

DONE = b"data: [DONE]\n\n"


def event(data: Any) -> bytes:
    """One SSE event carrying `data` as JSON."""
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


def error_event(body: Any) -> bytes:
    """An error after the stream began (the status is sent): `data: {"error": …}`, which the
    `openai` SDKs raise as an `APIError`."""
    return event(body)


@dataclass(frozen=True)
class Piece:
    """What one event carries of one choice: text, and the logprobs of the tokens before it
    (`offset`: the characters of the token texts sent before them, completions'
    `text_offset`)."""

    text: str
    logprobs: TokenLogprobs | None = None
    offset: int = 0


@dataclass
class StreamCursor:
    """One choice's stream: what to send next, held back by one character (`add`), and the
    rest with the result (`finish`).

    The chunks of a run that is later run again (a worker died) are text already sent; the new
    run's text is sent only past it, and the result's past what was sent, so the client's text
    is the result's whenever the runs agree (greedy requests do). Logprobs likewise: those of
    the tokens past the ones already sent."""

    sent: str = ""
    tokens_sent: int = 0  # logprob entries given out (or held in `_pending`)
    offset: int = 0  # the characters of the token texts given out
    _stream: StreamedText = field(default_factory=StreamedText)
    _run_tokens: int = 0  # tokens of the current run let through
    _pending: list[TokenLogprobs] = field(default_factory=list)

    def add(self, chunk: GenerateChunk) -> Piece | None:
        """The event `chunk` allows, if any: new text (all but its last character)."""
        if chunk.run != self._stream.run:
            self._run_tokens = 0
        for ready in self._stream.ready(chunk):
            start, self._run_tokens = self._run_tokens, self._run_tokens + len(ready.token_ids)
            if ready.logprobs is not None and start + len(ready.logprobs.tokens) > self.tokens_sent:
                self._pending.append(_part(ready.logprobs, self.tokens_sent - start))
                self.tokens_sent = start + len(ready.logprobs.tokens)
        text = self._advance(self._stream.shown[:-1])
        return self._piece(text) if text else None

    def finish(self, choice: Choice) -> Piece:
        """The choice's last event: what the result has beyond what was sent."""
        if choice.logprobs is not None and len(choice.logprobs.tokens) > self.tokens_sent:
            self._pending.append(_part(choice.logprobs, self.tokens_sent))
            self.tokens_sent = len(choice.logprobs.tokens)
        asked = choice.logprobs is not None or bool(self._pending)
        piece = self._piece(self._advance(choice.text))
        if asked and piece.logprobs is None:
            return Piece(piece.text, TokenLogprobs(), piece.offset)  # asked: an empty list
        return piece

    def _advance(self, text: str) -> str:
        if not text.startswith(self.sent):
            return ""  # text already sent cannot be taken back
        new, self.sent = text[len(self.sent) :], text
        return new

    def _piece(self, text: str) -> Piece:
        pending, self._pending = self._pending, []
        logprobs = _joined(pending) if pending else None
        offset = self.offset
        self.offset += sum(len(t) for t in logprobs.tokens) if logprobs else 0
        return Piece(text, logprobs, offset)


def _part(lp: TokenLogprobs, start: int) -> TokenLogprobs:
    """`lp`'s entries from `start` on."""
    start = max(0, start)
    return TokenLogprobs(
        tokens=lp.tokens[start:],
        token_logprobs=lp.token_logprobs[start:],
        top_ids=lp.top_ids[start:],
        top_logprobs=lp.top_logprobs[start:],
        top_tokens=lp.top_tokens[start:],
    )


def _joined(parts: list[TokenLogprobs]) -> TokenLogprobs:
    if len(parts) == 1:
        return parts[0]
    return TokenLogprobs(
        tokens=[t for p in parts for t in p.tokens],
        token_logprobs=[v for p in parts for v in p.token_logprobs],
        top_ids=[ids for p in parts for ids in p.top_ids],
        top_logprobs=[vs for p in parts for vs in p.top_logprobs],
        top_tokens=[ts for p in parts for ts in p.top_tokens],
    )


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

    def role(self, index: int = 0) -> bytes:
        """Chat's first event of a choice: the assistant's role, no text yet (none for
        completions)."""
        delta = {"role": "assistant", "content": ""}
        return event(self._envelope([_choice(index, None, None, delta=delta)]))

    def text(self, index: int, piece: Piece, finish_reason: str | None = None) -> bytes:
        """An event of choice `index` carrying `piece` (and, on its last, `finish_reason`)."""
        lp = piece.logprobs
        logprobs = (
            None if lp is None else msgspec.to_builtins(stream_logprobs(self.url, lp, piece.offset))
        )
        if self.chat:
            delta = {"content": piece.text} if piece.text else {}
            return event(self._envelope([_choice(index, logprobs, finish_reason, delta=delta)]))
        return event(self._envelope([_choice(index, logprobs, finish_reason, text=piece.text)]))

    def call(
        self,
        index: int,
        delta: dict[str, Any],
        logprobs: TokenLogprobs | None = None,
        finish_reason: str | None = None,
    ) -> bytes:
        """A chat event of choice `index` carrying call pieces (`delta.tool_calls`, or the
        legacy `delta.function_call`)."""
        shown = (
            None if logprobs is None else msgspec.to_builtins(stream_logprobs(self.url, logprobs))
        )
        return event(self._envelope([_choice(index, shown, finish_reason, delta=delta)]))

    def usage(self, result: GenerateResult) -> bytes:
        """The last event with `stream_options.include_usage`: no choices, the usage."""
        out = self._envelope([])
        out["usage"] = msgspec.to_builtins(token_usage(result))
        return event(out)


def _function_call(calls: list[dict[str, Any]]) -> dict[str, Any]:
    """Tool-call pieces as the legacy `delta.function_call` (one call: its name, then its
    arguments in pieces; no index nor id)."""
    function: dict[str, str] = {}
    for call in calls:
        for key, value in (call.get("function") or {}).items():
            if value or key == "arguments":
                function[key] = function.get(key, "") + value
    return {"function_call": function}


def _choice(index: int, logprobs: Any, finish_reason: str | None, **content: Any) -> dict[str, Any]:
    return {"index": index, **content, "logprobs": logprobs, "finish_reason": finish_reason}


class ToolPieceLike(Protocol):
    """What a `ToolText` gives for a piece of output."""

    content: str  # text outside any call
    tool_calls: list[Any]  # `delta.tool_calls` entries: dicts, or msgspec Structs


class ToolText(Protocol):
    """Reads one choice's output as text and tool calls, a piece at a time: the seam for
    tool calls in a stream (`ops.gateway.tool_stream.CallText` for a constrained call;
    `messages.tool_parsing.ToolCallStream`, the model's own call format, for "auto")."""

    @property
    def called(self) -> bool: ...  # a call was started: the choice ends "tool_calls"
    def feed(self, text: str) -> ToolPieceLike: ...
    def finish(self) -> ToolPieceLike: ...  # what it held back, at the end of the output


class StreamEvents:
    """The events of one streamed answer with `n` choices, from the replies as they come.

    `tools`: makes each choice's `ToolText` when the request may call tools: its text is
    then streamed as `delta.content` and `delta.tool_calls` pieces (`tool_text`); a choice
    that started a call and stopped ends "tool_calls". `functions`: the request asked with the
    legacy `functions`: the call streams as `delta.function_call` and ends "function_call"."""

    def __init__(
        self,
        shape: ChunkShape,
        n: int = 1,
        *,
        tools: Callable[[], ToolText] | None = None,
        functions: bool = False,
    ) -> None:
        self.shape = shape
        self.functions = functions
        self.cursors = [StreamCursor() for _ in range(n)]
        self.tools = [tools() for _ in range(n)] if tools is not None and shape.chat else None
        self._held: list[list[TokenLogprobs]] = [[] for _ in range(n)]  # tool text's logprobs

    def start(self) -> list[bytes]:
        """The first events: chat's role, for each choice."""
        return [self.shape.role(i) for i in range(len(self.cursors))] if self.shape.chat else []

    def chunk(self, chunk: GenerateChunk) -> list[bytes]:
        """The events `chunk` allows (none for a choice this answer does not have)."""
        if not 0 <= chunk.index < len(self.cursors):
            return []
        piece = self.cursors[chunk.index].add(chunk)
        return [] if piece is None else self._events(chunk.index, piece, None)

    def result(self, result: GenerateResult) -> list[bytes]:
        """Each choice's last event, with its finish reason, and the usage when asked."""
        out = []
        for choice in result_choices(result):
            if 0 <= choice.index < len(self.cursors):
                piece = self.cursors[choice.index].finish(choice)
                out += self._events(choice.index, piece, openai_finish_reason(choice.finish_reason))
        if self.shape.include_usage:
            out.append(self.shape.usage(result))
        return out

    def _events(self, index: int, piece: Piece, finish_reason: str | None) -> list[bytes]:
        if self.tools is None:
            return [self.shape.text(index, piece, finish_reason)]
        return self.tool_text(index, piece, finish_reason)

    def tool_text(self, index: int, piece: Piece, finish_reason: str | None) -> list[bytes]:
        """The events of choice `index`'s next `piece` when it may call tools: its content and
        call pieces (the text's logprobs wait for the first event)."""
        assert self.tools is not None
        reader, held = self.tools[index], self._held[index]
        read = [reader.feed(piece.text)]
        if finish_reason is not None:
            read.append(reader.finish())
            if reader.called and finish_reason == "stop":
                finish_reason = "function_call" if self.functions else "tool_calls"
        if piece.logprobs is not None:
            held.append(piece.logprobs)
        content = "".join(r.content for r in read)
        calls = [msgspec.to_builtins(c) for r in read for c in r.tool_calls]
        if not content and not calls and finish_reason is None:
            return []
        logprobs = _joined(held) if held else None
        held.clear()
        out = []
        if content or not calls:
            last = None if calls else finish_reason
            out.append(self.shape.text(index, Piece(content, logprobs), last))
            logprobs = None
        if calls:
            delta = _function_call(calls) if self.functions else {"tool_calls": calls}
            out.append(self.shape.call(index, delta, logprobs, finish_reason))
        return out
