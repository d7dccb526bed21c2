"""A constrained tool call's text, streamed as `delta.tool_calls` pieces.

Under `tool_choice` "required" or a named function, the model writes one JSON object
`{"name": …, "arguments": {…}}` (`messages.openai_tools.call_schema`). Fed that text a piece
at a time, `CallText` gives the pieces OpenAI streams for a call:

    {"index": 0, "id": "call_…", "type": "function", "function": {"name": "f", "arguments": ""}}
    {"index": 0, "function": {"arguments": "{\"city\":"}}
    {"index": 0, "function": {"arguments": "\"Paris\"}"}}

the name once it is whole, then the arguments object's text as it comes, without the
whitespace between its tokens (the arguments read as the answer's do: compact JSON). A call
cut off before its name is whole is given as text at the end (`finish`), as the answer gives
it. Pure: no I/O, one character at a time, so any split of the text gives the same pieces.

`CallText` reads the way `ops.gateway.sse.ToolText` says, so a reader of a model's own call
format (free text, then calls) streams through the same events.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

_SPACE = " \t\r\n"


@dataclass
class ToolPiece:
    """What a piece of output adds: `content` text and `delta.tool_calls` entries."""

    content: str = ""
    tool_calls: list[Any] = field(default_factory=list)


class CallText:
    """One call's JSON text → its tool-call delta pieces (`feed`); `started`: the name went."""

    def __init__(self, call_id: str | None = None) -> None:
        self.call_id = call_id or f"call_{uuid.uuid4().hex[:24]}"
        self.started = False
        self.name: str | None = None
        self.text = ""  # everything fed
        self._depth = 0
        self._in_string = False
        self._escape = False
        self._key: list[str] | None = None  # the depth-1 key being read
        self._last_key = ""
        self._after_colon = False  # a depth-1 value is next
        self._name_raw: list[str] | None = None  # the name's string, escapes and all
        self._in_arguments = False
        self._arguments: list[str] = []  # argument text not yet given out

    @property
    def called(self) -> bool:
        """A call was started (its name was given)."""
        return self.started

    def feed(self, text: str) -> ToolPiece:
        """The delta pieces `text` (the call's next text) completes."""
        return ToolPiece(tool_calls=self.pieces(text))

    def finish(self) -> ToolPiece:
        """The end of the output: a call never started is the text."""
        return ToolPiece() if self.started else ToolPiece(content=self.text)

    def pieces(self, text: str) -> list[dict[str, Any]]:
        """The delta pieces `text` (the call's next text) completes."""
        self.text += text
        for char in text:
            self._step(char)
        out = []
        if self.name is not None and not self.started:
            self.started = True
            function = {"name": self.name, "arguments": ""}
            out.append({"index": 0, "id": self.call_id, "type": "function", "function": function})
        if self.started and self._arguments:
            out.append({"index": 0, "function": {"arguments": "".join(self._arguments)}})
            self._arguments = []
        return out

    def _step(self, char: str) -> None:
        if self._in_string:
            self._string_char(char)
            return
        if self._in_arguments and char not in _SPACE:
            self._arguments.append(char)
        if char == '"':
            self._in_string = True
            if self._depth == 1 and self._key is None and self._name_raw is None:
                if self._last_key == "name" and self._after_colon:
                    self._name_raw = []
                else:
                    self._key = []
        elif char in "{[":
            self._depth += 1
            if self._depth == 2 and self._last_key == "arguments" and self._after_colon:
                self._in_arguments = True
                self._arguments.append(char)
        elif char in "}]":
            self._depth -= 1
            if self._depth == 1 and self._in_arguments:
                self._in_arguments = False
        elif char == ":" and self._depth == 1:
            self._after_colon = True
            return
        elif char == "," and self._depth == 1:
            self._last_key = ""
        if char not in _SPACE:
            self._after_colon = False

    def _string_char(self, char: str) -> None:
        if self._in_arguments:
            self._arguments.append(char)
        ended = char == '"' and not self._escape
        self._escape = char == "\\" and not self._escape
        if self._name_raw is not None:
            if not ended:
                self._name_raw.append(char)
            else:
                self.name = str(json.loads('"' + "".join(self._name_raw) + '"'))
                self._name_raw = None
        elif self._key is not None and not ended:
            self._key.append(char)
        if ended:
            self._in_string = False
            if self._key is not None:
                self._last_key, self._key = "".join(self._key), None
            self._after_colon = False
