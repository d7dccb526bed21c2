"""OpenAI function tools in a chat: what the request carries, and `tool_calls` out.

    format = tool_call_format(chat.tools, chat.tool_choice)   # a ResponseFormat, or None
    call = parse_tool_call(result.text)                       # a ToolCall, or None

With `tool_choice` "required" or a named function, the output is constrained to one call:
JSON `{"name": <a tool's name>, "arguments": <an object valid against that tool's
parameters>}`, through the JSON-schema constraint (`response_format` on the wire): one object
schema per tool, the name a `const`, joined with `anyOf`. The answer turns that text back into
OpenAI's `tool_calls` with `finish_reason` "tool_calls".

With "auto" (the default with tools) `tool_call_format` gives None: the request carries the
tools (rendered by the model's chat template) and `tool_calling`, and the worker constrains
the answer to free text or calls in the model's own format (`messages.tool_formats`); the
answer is parsed for them (`messages.tool_parsing`). "none" ignores the tools.

Pure functions: no I/O.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

import msgspec

from messages import tool_schema
from messages.error_codes import ErrorCode
from messages.errors import BatchLineRefused, InvalidRequest
from messages.limits import MAX_TOOL_NAME_CHARS, MAX_TOOLS
from messages.response_format import JsonSchemaFormat, ResponseFormat, check_plain_json
from messages.tool_formats import constraint_text

# Refusals carry `openai_batch_mapping.LineCode` values (a StrEnum: equal to these strings),
# written out here because that module imports this one.
_NAME = re.compile(rf"[A-Za-z0-9_-]{{1,{MAX_TOOL_NAME_CHARS}}}")


class FunctionDef(msgspec.Struct, kw_only=True, forbid_unknown_fields=False, omit_defaults=True):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None  # JSON Schema of the arguments object
    strict: bool | None = None


class Tool(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    type: str = "function"
    function: FunctionDef | None = None


class NamedFunction(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    name: str


class NamedTool(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    """`tool_choice: {"type": "function", "function": {"name": ...}}`."""

    type: str = "function"
    function: NamedFunction


class FunctionCall(msgspec.Struct, kw_only=True):
    name: str
    arguments: str  # a JSON object, as text (OpenAI's)


class ToolCall(msgspec.Struct, kw_only=True):
    id: str
    type: str = "function"
    function: FunctionCall


def tool_call_format(
    tools: list[Tool] | None, tool_choice: str | NamedTool | None
) -> ResponseFormat | None:
    """The constraint that makes the output one call of `tools` as `tool_choice` allows, or
    None when no call is forced (no tools, "none", or "auto": the model's own format then,
    `messages.tool_formats`). Raises `BatchLineRefused` for a name that is not a tool's, an
    unknown choice, or a malformed tool."""
    if not tools:
        if tool_choice is not None and tool_choice != "none":
            raise BatchLineRefused(
                "invalid_body", "`tool_choice` needs `tools`", param="tool_choice"
            )
        return None
    if tool_choice == "none":
        return None
    if tool_choice is None or tool_choice == "auto":
        check_tools(tools)
        return None
    functions = _functions(tools)
    if isinstance(tool_choice, NamedTool):
        chosen = [f for f in functions if f.name == tool_choice.function.name]
        if tool_choice.type != "function" or not chosen:
            raise BatchLineRefused(
                "invalid_body",
                f"tool_choice names {tool_choice.function.name[:80]!r}, which is not a function "
                "in `tools`",
                param="tool_choice",
            )
        functions = chosen
    elif tool_choice != "required":
        raise BatchLineRefused(
            "invalid_body",
            f'tool_choice must be "none", "auto", "required" or a named function, got '
            f"{tool_choice[:40]!r}",
            param="tool_choice",
        )
    schema = call_schema(functions)
    return ResponseFormat(
        type="json_schema",
        json_schema=JsonSchemaFormat(
            name="tool_call", schema=schema, strict=all(f.strict for f in functions)
        ),
    )


def check_tools(tools: list[Tool]) -> list[FunctionDef]:
    """`tools`' functions; `BatchLineRefused` for too many, a tool that is not a function, a
    malformed name, two of one name, or parameters that are not plain JSON."""
    return _functions(tools)


def _functions(tools: list[Tool]) -> list[FunctionDef]:
    if len(tools) > MAX_TOOLS:
        raise BatchLineRefused(
            "invalid_body", f"at most {MAX_TOOLS} tools, got {len(tools)}", param="tools"
        )
    functions: list[FunctionDef] = []
    for i, tool in enumerate(tools):
        if tool.type != "function" or tool.function is None:
            raise BatchLineRefused(
                "unsupported_parameter",
                f"tools[{i}] is of type {tool.type[:40]!r}: only function tools are supported",
                param="tools",
            )
        name = tool.function.name
        if not _NAME.fullmatch(name):
            raise BatchLineRefused(
                "invalid_body",
                f"tools[{i}].function.name must be 1 to {MAX_TOOL_NAME_CHARS} of a-z, A-Z, 0-9, "
                f"'_' and '-', got {name[:80]!r}",
                param="tools",
            )
        if any(f.name == name for f in functions):
            raise BatchLineRefused("invalid_body", f"two tools are named {name!r}", param="tools")
        if tool.function.parameters is not None:
            try:
                check_plain_json(tool.function.parameters)
            except InvalidRequest as exc:
                raise BatchLineRefused(
                    ErrorCode.INVALID_RESPONSE_FORMAT, f"tools[{i}]: {exc.message}", param="tools"
                ) from None
        functions.append(tool.function)
    return functions


def call_schema(
    functions: list[FunctionDef], *, at: str = "#", arguments: str = "arguments"
) -> dict[str, Any]:
    """The JSON Schema of one call of any of `functions` (`messages.tool_schema`)."""
    return tool_schema.call_schema(
        [(f.name, f.parameters) for f in functions], at=at, arguments=arguments
    )


def parse_tool_call(text: str) -> ToolCall | None:
    """The call a constrained output holds, or None when it is not a whole call (cut off)."""
    try:
        call = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return None
    if not isinstance(call.get("arguments"), dict):
        return None
    arguments = json.dumps(call["arguments"], ensure_ascii=False, separators=(",", ":"))
    return ToolCall(
        id=f"call_{uuid.uuid4().hex[:24]}",
        function=FunctionCall(name=call["name"], arguments=arguments),
    )


def check_tool_calling(
    tools: list[Tool] | None, calling: bool, *, with_messages: bool, constrained: bool
) -> None:
    """A request's tool fields (`GenerateRequest.tools`, `tool_calling` given: `calling`):
    `InvalidRequest` unless the tools are well formed, come with `messages` and, with
    `calling`, are there and no other constraint is (`constrained`)."""
    if tools:
        if not with_messages:
            raise InvalidRequest(ErrorCode.INVALID_REQUEST, "`tools` need `messages` (a chat)")
        try:
            _functions(tools)
        except BatchLineRefused as exc:
            known = exc.code in set(ErrorCode)
            code = ErrorCode(exc.code) if known else ErrorCode.INVALID_REQUEST
            raise InvalidRequest(code, exc.message) from None
    if calling and not tools:
        raise InvalidRequest(ErrorCode.INVALID_REQUEST, "`tool_calling` needs `tools`")
    if calling and constrained:
        raise InvalidRequest(
            ErrorCode.INVALID_RESPONSE_FORMAT,
            "give at most one constraint: tool_calling (tool_choice auto) and a constrained "
            "response_format or structured_output",
        )


def auto_constraint_text(tools: list[Tool], parallel: bool) -> str:
    """The worker's "tools" constraint for `tools` under tool_choice "auto"
    (`messages.tool_formats.constraint_text`); `tools` checked (`check_tool_calling`)."""
    functions = [t.function for t in tools if t.function is not None]
    return constraint_text(
        [(f.name, f.parameters) for f in functions],
        parallel=parallel,
        lenient=not all(f.strict for f in functions),
    )
