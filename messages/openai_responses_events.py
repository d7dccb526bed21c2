"""A streamed Response: chat completion chunks in, the Responses API's events out, in order.

    events = ResponseEvents(asked, "resp_…", created_at, model)
    events.start()              # response.created, response.in_progress
    events.chunk(chunk)         # per chat.completion.chunk (an `{"error": …}` one included)
    events.finish()             # the open item's done events, then response.completed
                                # (or response.incomplete: the token limit was reached)

Each event is `{"type": …, "sequence_number": n, …}`, n counting from 0. Text opens one
`message` item: output_item.added, content_part.added, output_text.delta per piece, then
output_text.done, content_part.done, output_item.done. Each streamed tool call (chat's
`delta.tool_calls[i]`) opens one `function_call` item: output_item.added,
function_call_arguments.delta per piece, function_call_arguments.done, output_item.done. An
error after the start is an `error` event, then response.failed.

`replayed(completion)` turns a whole `chat.completion` into the chunks that would have streamed
it, for an answer the chat door does not stream. Pure: no I/O.
"""

from __future__ import annotations

from typing import Any

from messages.openai_responses import ResponsesAsked
from messages.openai_responses_answers import call_item, message_item, response_object, status_of


class ResponseEvents:
    """The events of one streamed Response, built from its chat chunks."""

    def __init__(
        self, asked: ResponsesAsked, response_id: str, created_at: int, model: str
    ) -> None:
        self.asked = asked
        self.response_id = response_id
        self.created_at = created_at
        self.model = model
        self.output: list[dict[str, Any]] = []  # the items done
        self._base = response_id.removeprefix("resp_")
        self._open: dict[str, Any] | None = None  # the item being streamed
        self._calls: dict[int, int] = {}  # a chat tool call's index → its output index
        self._finish: str | None = None
        self._usage: dict[str, Any] | None = None
        self._sequence = 0

    def start(self) -> list[dict[str, Any]]:
        response = self._response("in_progress")
        return [
            self._event("response.created", response=response),
            self._event("response.in_progress", response=response),
        ]

    def chunk(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        """The events a chat chunk adds (none for a chunk that only names the role)."""
        if isinstance(chunk.get("error"), dict):
            return self.fail(chunk["error"])
        self.model = chunk.get("model") or self.model
        if chunk.get("usage"):
            self._usage = chunk["usage"]
        events: list[dict[str, Any]] = []
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue  # a Response holds one answer
            delta = choice.get("delta") or {}
            if delta.get("content"):
                events += self._text(delta["content"])
            for call in delta.get("tool_calls") or []:
                events += self._call(call)
            if choice.get("finish_reason"):
                self._finish = choice["finish_reason"]
        return events

    def finish(self) -> list[dict[str, Any]]:
        """The open item's done events, then the Response: response.completed, or
        response.incomplete (with its reason) when the run stopped at its token limit."""
        events = []
        if self._open is None and not self.output:
            events += self._open_message()  # an empty answer is an empty message
        events += self._close()
        status = status_of(self._finish)
        response = self._response(status)
        kind = "response.completed" if status == "completed" else f"response.{status}"
        return [*events, self._event(kind, response=response)]

    def fail(self, error: dict[str, Any]) -> list[dict[str, Any]]:
        """An error after the stream began: an `error` event, then response.failed."""
        message = str(error.get("message") or "the request failed")
        failed = self._response("failed", error={"code": _failure_code(error), "message": message})
        return [
            self._event("error", code=error.get("code"), message=message, param=error.get("param")),
            self._event("response.failed", response=failed),
        ]

    def _text(self, text: str) -> list[dict[str, Any]]:
        events = []
        if self._open is None or self._open["type"] != "message":
            events += self._close() + self._open_message()
        assert self._open is not None
        self._open["content"][0]["text"] += text
        return [
            *events,
            self._event(
                "response.output_text.delta",
                item_id=self._open["id"],
                output_index=len(self.output),
                content_index=0,
                delta=text,
                logprobs=[],
            ),
        ]

    def _open_message(self) -> list[dict[str, Any]]:
        self._open = message_item(f"msg_{self._base}", "", "in_progress")
        self._open["content"] = []
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        added = self._event(
            "response.output_item.added", output_index=len(self.output), item=_copy(self._open)
        )
        self._open["content"].append(part)
        return [
            added,
            self._event(
                "response.content_part.added",
                item_id=self._open["id"],
                output_index=len(self.output),
                content_index=0,
                part=dict(part),
            ),
        ]

    def _call(self, call: dict[str, Any]) -> list[dict[str, Any]]:
        index = call.get("index", 0)
        function = call.get("function") or {}
        events = []
        if index not in self._calls:
            events += self._close()
            self._calls[index] = len(self.output)
            self._open = call_item(
                f"fc_{self._base}_{index}",
                call.get("id") or f"call_{self._base}_{index}",
                function.get("name") or "",
                "",
                "in_progress",
            )
            events.append(
                self._event(
                    "response.output_item.added",
                    output_index=len(self.output),
                    item=_copy(self._open),
                )
            )
        if self._open is None or self._calls[index] != len(self.output):
            return events  # a piece of a call already closed: chat streams calls in turn
        if piece := function.get("arguments"):
            self._open["arguments"] += piece
            events.append(
                self._event(
                    "response.function_call_arguments.delta",
                    item_id=self._open["id"],
                    output_index=len(self.output),
                    delta=piece,
                )
            )
        return events

    def _close(self) -> list[dict[str, Any]]:
        """The done events of the open item, which joins `output`."""
        item, self._open = self._open, None
        if item is None:
            return []
        at = len(self.output)
        item["status"] = status_of(self._finish) if self._finish else "completed"
        events = []
        if item["type"] == "message":
            part = item["content"][0]
            shared = {"item_id": item["id"], "output_index": at, "content_index": 0}
            events += [
                self._event("response.output_text.done", **shared, text=part["text"], logprobs=[]),
                self._event("response.content_part.done", **shared, part=dict(part)),
            ]
        else:
            events.append(
                self._event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=at,
                    name=item["name"],
                    arguments=item["arguments"],
                )
            )
        self.output.append(item)
        return [
            *events,
            self._event("response.output_item.done", output_index=at, item=_copy(item)),
        ]

    def _response(self, status: str, error: dict[str, Any] | None = None) -> dict[str, Any]:
        return response_object(
            self.asked,
            response_id=self.response_id,
            created_at=self.created_at,
            model=self.model,
            status=status,
            output=[_copy(item) for item in self.output],
            usage=self._usage,
            finish_reason=self._finish,
            error=error,
        )

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return event


def replayed(completion: dict[str, Any]) -> list[dict[str, Any]]:
    """The chat chunks that stream `completion` (its first choice): its text, its tool calls
    (each whole), the finish reason and the usage."""
    choice = completion["choices"][0]
    message = choice.get("message") or {}
    delta: dict[str, Any] = {"role": "assistant", "content": message.get("content") or ""}
    if message.get("tool_calls"):
        delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
    head = {"model": completion.get("model")}
    return [
        {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
        {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]},
        {**head, "choices": [], "usage": completion.get("usage")},
    ]


def _failure_code(error: dict[str, Any]) -> str:
    """OpenAI's codes for a failed Response are few: a refused or timed-out run is theirs'
    `server_error`, a full fleet `rate_limit_exceeded`."""
    return "rate_limit_exceeded" if error.get("code") == "rate_limit_exceeded" else "server_error"


def _copy(item: dict[str, Any]) -> dict[str, Any]:
    copied = dict(item)
    if "content" in copied:
        copied["content"] = [dict(part) for part in copied["content"]]
    return copied
