"""Tool calls read back from a model's output, whole or as it streams.

    answer = parse_calls(result.text, fmt)        # ParsedAnswer: content, calls
    stream = ToolCallStream(fmt)                  # one per streamed choice, or:
    stream = stream_for(request.metadata[TOOLS_KEY], fmt)   # "required" reads bare JSON
    piece = stream.feed(chunk.text)               # StreamPiece: content, tool_calls deltas
    piece = stream.finish()                       # what was held back

`fmt` is the model's format (`messages.tool_formats.ToolFormat`, which the worker names in
the result's `model.tool_format`); None reads the `hermes` blocks (tokenmill's default).

The output is text, then the calls region, which starts at the format's opening marker
(`<tool_call>`, `[TOOL_CALLS]`) or, for `llama3_json`, at a `{` (or `<|python_tag|>`) that
opens the answer; a `mistral` answer opening with `[{` starts it too (its marker is a special
token, which the output's text leaves out). In the calls region every JSON object at the top
level is one call `{"name": ..., "arguments": {...}}` (`parameters` for Llama's); what lies
between them (closing markers, commas, whitespace) is skipped.

Streaming follows OpenAI's `delta.tool_calls`: a call's first delta has its `index`, `id`,
`type` and `function.name` (and empty `arguments`) as soon as the name is complete; then its
`arguments` text in pieces, which laid end to end are the arguments object. Text that could
still be the start of a marker is held back until it is not. `parse_calls` runs the same
stream over the whole text, so a streamed and a whole answer agree; a call cut off before its
arguments closed is dropped, and an output with no whole call is text.

Pure: no I/O.
"""

from __future__ import annotations

import json
import re
import uuid

import msgspec

from messages.openai_tools import FunctionCall, ToolCall
from messages.tool_formats import (
    HERMES_OPEN,
    MISTRAL_OPEN,
    PYTHON_TAG,
    ToolFormat,
)

_HEAD = re.compile(r'\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*')


class FunctionDelta(msgspec.Struct, kw_only=True):
    name: str | msgspec.UnsetType = msgspec.UNSET
    arguments: str = ""


class ToolCallDelta(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One entry of a stream chunk's `delta.tool_calls` (OpenAI's shape)."""

    index: int
    id: str | msgspec.UnsetType = msgspec.UNSET
    type: str | msgspec.UnsetType = msgspec.UNSET
    function: FunctionDelta


class StreamPiece(msgspec.Struct, kw_only=True):
    """What one piece of output adds: `content` text (may be "") and call deltas."""

    content: str = ""
    tool_calls: list[ToolCallDelta] = msgspec.field(default_factory=list)


class ParsedAnswer(msgspec.Struct, kw_only=True):
    """`content`: the text before the calls (None when there is none and calls were made),
    or the whole text when no call was made; `calls`: the whole calls, in order."""

    content: str | None
    calls: list[ToolCall]


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class ToolCallStream:
    """Reads one choice's output piece by piece (see the module's docstring)."""

    def __init__(self, fmt: ToolFormat | str | None = None) -> None:
        self.fmt = ToolFormat(fmt) if fmt else ToolFormat.DEFAULT
        self._held = ""  # text not yet known to be content or a marker
        self._in_calls = False
        self._started = False  # some content was given (a leading `{` is then text)
        self._object = ""  # the call object being read
        self._depth = 0
        self._in_string = False
        self._escape = False
        self._index = -1  # the current call's index (its header given), -1 before any
        self._header = False  # the current object's header delta was given
        self._args_at = 0  # where its arguments start in `_object`, once known
        self._given = 0  # how much of `_object` was given as arguments
        self._args_done = False
        self.calls = 0  # headers given

    @property
    def called(self) -> bool:
        """Some call was started (the choice's `finish_reason` is then "tool_calls")."""
        return self.calls > 0

    def feed(self, text: str) -> StreamPiece:
        piece = StreamPiece()
        if not self._in_calls:
            text, self._held = self._held + text, ""
            text = self._text(text, piece, final=False)
        if self._in_calls and text:
            self._calls(text, piece)
        return piece

    def finish(self) -> StreamPiece:
        """The end of the output: held-back text is content."""
        piece = StreamPiece()
        if not self._in_calls and self._held:
            text, self._held = self._held, ""
            self._text(text, piece, final=True)
        return piece

    # -- text before the calls -----------------------------------------------------------

    def _text(self, text: str, piece: StreamPiece, *, final: bool) -> str:
        """Give `text`'s content; return what follows the calls' start (entering them)."""
        if self.fmt in (ToolFormat.LLAMA3_JSON, ToolFormat.MISTRAL) and not self._started:
            stripped = text.lstrip()
            opener = "{" if self.fmt is ToolFormat.LLAMA3_JSON else "[{"
            tag = PYTHON_TAG if self.fmt is ToolFormat.LLAMA3_JSON else MISTRAL_OPEN
            if stripped.startswith(tag):
                self._in_calls = True
                return stripped[len(tag) :]
            if stripped.startswith(opener):
                self._in_calls = True
                return stripped
            undecided = not stripped or opener.startswith(stripped) or tag.startswith(stripped)
            if undecided and not final:
                self._held = text
                return ""
        marker = MISTRAL_OPEN if self.fmt is ToolFormat.MISTRAL else HERMES_OPEN
        if self.fmt is ToolFormat.LLAMA3_JSON:
            marker = PYTHON_TAG
        at = text.find(marker)
        if at >= 0:
            self._content(text[:at], piece)
            self._in_calls = True
            return text[at + len(marker) :]
        keep = 0 if final else _partial_marker(text, marker)
        self._content(text[: len(text) - keep], piece)
        self._held = text[len(text) - keep :]
        return ""

    def _content(self, text: str, piece: StreamPiece) -> None:
        if text:
            piece.content += text
            self._started = self._started or bool(text.strip())

    # -- the calls region ----------------------------------------------------------------

    def _calls(self, text: str, piece: StreamPiece) -> None:
        for char in text:
            if self._depth == 0:
                if char != "{":
                    continue  # markers, separators, whitespace between calls
                self._object, self._header, self._args_done = "", False, False
            self._object += char
            self._scan(char)
            if not self._header:
                found = _HEAD.match(self._object)
                if found is None:
                    continue
                self._header = True
                self._index += 1
                self.calls += 1
                self._args_at = self._given = found.end()
                name = json.loads(f'"{found.group(1)}"')
                piece.tool_calls.append(
                    ToolCallDelta(
                        index=self._index,
                        id=new_call_id(),
                        type="function",
                        function=FunctionDelta(name=name, arguments=""),
                    )
                )
                continue
            if self._args_done:
                continue
            end = len(self._object)
            if not self._in_string and self._depth <= 1:
                if self._depth == 1 and char in "}]":
                    self._args_done = True  # this char closes the arguments
                elif char in ",}":
                    self._args_done = True  # a plain value, closed just before this char
                    end -= 1
            if end > self._given:
                self._arguments(self._object[self._given : end], piece)
                self._given = end

    def _scan(self, char: str) -> None:
        if self._in_string:
            if self._escape:
                self._escape = False
            elif char == "\\":
                self._escape = True
            elif char == '"':
                self._in_string = False
        elif char == '"':
            self._in_string = True
        elif char in "{[":
            self._depth += 1
        elif char in "}]":
            self._depth -= 1

    def _arguments(self, text: str, piece: StreamPiece) -> None:
        last = piece.tool_calls[-1] if piece.tool_calls else None
        if last is not None and last.index == self._index:
            last.function.arguments += text
        else:
            piece.tool_calls.append(
                ToolCallDelta(index=self._index, function=FunctionDelta(arguments=text))
            )


def _partial_marker(text: str, marker: str) -> int:
    """The length of the longest end of `text` that begins `marker` (held back)."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0


def parse_calls(text: str, fmt: ToolFormat | str | None = None) -> ParsedAnswer:
    """The calls a whole output holds (see the module's docstring)."""
    stream = ToolCallStream(fmt)
    pieces = [stream.feed(text), stream.finish()]
    content = "".join(p.content for p in pieces)
    names: dict[int, tuple[str, str]] = {}
    arguments: dict[int, str] = {}
    for delta in (d for p in pieces for d in p.tool_calls):
        if isinstance(delta.function.name, str) and isinstance(delta.id, str):
            names[delta.index] = (delta.id, delta.function.name)
        arguments[delta.index] = arguments.get(delta.index, "") + delta.function.arguments
    calls = []
    for index, (call_id, name) in sorted(names.items()):
        try:
            value = json.loads(arguments.get(index, ""))
        except (ValueError, RecursionError):
            break  # cut off: this call and any after it are not whole
        if not isinstance(value, dict):
            break
        compact = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
        calls.append(ToolCall(id=call_id, function=FunctionCall(name=name, arguments=compact)))
    if not calls:
        return ParsedAnswer(content=text, calls=[])
    return ParsedAnswer(content=content.strip() or None, calls=calls)


def stream_for(asked: str, tool_format: str | None) -> ToolCallStream:
    """The reader of one streamed choice of a request with tools. `asked`: how the request
    asked for calls (the value of the request's metadata `openai_chat_tools.TOOLS_KEY`:
    "auto" or "required", "+functions" after it for the legacy fields); `tool_format`: the
    model's (`ModelRef.tool_format`; "" or None for the default). A forced call is one bare
    JSON object, `{"name": ..., "arguments": {...}}`, read as Llama's format reads one."""
    if asked.startswith("required"):
        return ToolCallStream(ToolFormat.LLAMA3_JSON)
    return ToolCallStream(tool_format or None)
