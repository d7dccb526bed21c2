"""OpenAI's Responses API (`POST /v1/responses`) over the chat mapping: a body in, a Response out.

    asked = to_chat(body)                       # or BatchLineRefused: what cannot be served
    chat_body = asked.chat                      # a /v1/chat/completions body: mapped as any
    response = to_response(asked, completion, "resp_…")   # the chat answer, as a Response
                                                # (`messages.openai_responses_answers`)

A Responses request is run as the chat completion it amounts to, so everything the chat door
serves (sampling, constraints, tools) serves it too:

    instructions                      → a first `system` message
    input "text"                      → one `user` message
    input items:
      {"role", "content"} messages    → messages (`developer` as `system`; text parts only)
      function_call                   → the assistant's `tool_calls` (joined to the assistant
                                        message just before it, as one turn)
      function_call_output            → a `tool` message
    tools [{"type": "function", "name", "description", "parameters", "strict"}]
                                      → chat's tools ({"type": "function", "function": {…}})
    tool_choice {"type": "function", "name"} → {"type": "function", "function": {"name"}}
    text.format (json_schema, json_object)   → response_format
    max_output_tokens                 → max_completion_tokens

Refused, with the field named: `previous_response_id` and `conversation` (responses are not
stored: send the whole conversation in `input`), `background`, `prompt` templates, tools other
than functions (hosted tools run at OpenAI), and input items other than the three above.
Accepted without effect: `store`, `include`, `reasoning`, `truncation` (the input is never cut:
one too long is refused), `max_tool_calls`, `top_logprobs`, `stream_options`. `metadata` is
echoed. Any other field goes on to the chat body as it is, where the chat mapping decides.

The answer is `messages.openai_responses_answers`, streamed `messages.openai_responses_events`.
Pure functions: no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import msgspec

from messages.errors import BatchLineRefused
from messages.openai_batch_mapping import LineCode

RESPONSES_URL = "/v1/responses"

# The body's fields this mapping reads; every other one goes on to the chat body.
_READ = frozenset(
    {
        "model", "input", "instructions", "tools", "tool_choice", "max_output_tokens",
        "temperature", "top_p", "parallel_tool_calls", "text", "metadata", "stream",
        "previous_response_id", "conversation", "background", "prompt",
        "store", "include", "reasoning", "truncation", "max_tool_calls", "top_logprobs",
        "stream_options", "prompt_cache_retention",
    }
)  # fmt: skip
# Chat fields a Responses body does not have: refused rather than run with a chat meaning.
_CHAT_ONLY = ("messages", "n", "max_tokens", "max_completion_tokens", "response_format")
_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
_TEXT_PARTS = frozenset({"input_text", "output_text", "text", "refusal"})
_PATH = re.compile(r"(?:at `\$\.|missing required field `)([A-Za-z_]+)")


class ResponsesBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    """The fields of a `POST /v1/responses` body this mapping reads (`None`: not given)."""

    model: str | None = None
    input: str | list[Any]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None
    metadata: dict[str, str] | None = None
    stream: bool | None = None
    previous_response_id: str | None = None
    conversation: str | dict[str, Any] | None = None
    background: bool | None = None
    prompt: dict[str, Any] | None = None
    truncation: str | None = None


@dataclass(frozen=True)
class ResponsesAsked:
    """A Responses body, mapped: the chat body to run, and the body's settings a Response
    repeats (`echo`)."""

    chat: dict[str, Any]
    echo: dict[str, Any]
    stream: bool


def to_chat(body: dict[str, Any]) -> ResponsesAsked:
    """The chat completions body `body` amounts to; `BatchLineRefused` for what cannot be
    served (see the module's docstring)."""
    asked = _convert(body)
    _refuse_unserved(asked, body)
    chat: dict[str, Any] = {k: v for k, v in body.items() if k not in _READ}
    chat["messages"] = _messages(asked.input, asked.instructions)
    if asked.model is not None:
        chat["model"] = asked.model
    for name in ("temperature", "top_p", "parallel_tool_calls"):
        if (value := getattr(asked, name)) is not None:
            chat[name] = value
    if asked.max_output_tokens is not None:
        chat["max_completion_tokens"] = asked.max_output_tokens
    tools = [_chat_tool(i, tool) for i, tool in enumerate(asked.tools or [])]
    if tools:
        chat["tools"] = tools
    if asked.tool_choice is not None and (tools or asked.tool_choice not in ("auto", "none")):
        chat["tool_choice"] = _chat_tool_choice(asked.tool_choice)
    if (response_format := _response_format(asked.text)) is not None:
        chat["response_format"] = response_format
    return ResponsesAsked(chat=chat, echo=_echo(asked), stream=bool(asked.stream))


def _convert(body: dict[str, Any]) -> ResponsesBody:
    try:
        return msgspec.convert(body, ResponsesBody)
    except msgspec.ValidationError as exc:
        raise BatchLineRefused(LineCode.INVALID_BODY, f"body: {exc}", param=_where(exc)) from None
    except RecursionError:
        raise BatchLineRefused(LineCode.INVALID_BODY, "body: nested too deeply") from None


def _where(exc: msgspec.ValidationError) -> str | None:
    found = _PATH.search(str(exc))
    return found.group(1) if found else None


def _refuse_unserved(asked: ResponsesBody, body: dict[str, Any]) -> None:
    if asked.previous_response_id is not None or asked.conversation is not None:
        param = "previous_response_id" if asked.previous_response_id is not None else "conversation"
        raise _unsupported(
            f"`{param}` is not supported: responses are not stored here. Send the whole "
            "conversation in `input` (earlier answers' output items included)",
            param,
        )
    if asked.background:
        raise _unsupported("`background` is not supported: ask without it", "background")
    if asked.prompt is not None:
        raise _unsupported("`prompt` (a stored prompt template) is not supported", "prompt")
    for name in _CHAT_ONLY:
        if body.get(name) is not None:
            raise BatchLineRefused(
                LineCode.INVALID_BODY,
                f"`{name}` is a chat completions field, not a Responses one (see `input`, "
                "`max_output_tokens` and `text.format`)",
                param=name,
            )
    if isinstance(asked.input, list) and not asked.input:
        raise BatchLineRefused(LineCode.INVALID_BODY, "`input` is empty", param="input")


def _unsupported(message: str, param: str) -> BatchLineRefused:
    return BatchLineRefused(LineCode.UNSUPPORTED_PARAMETER, message, param=param)


def _messages(given: str | list[Any], instructions: str | None) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    if isinstance(given, str):
        return [*messages, {"role": "user", "content": given}]
    for i, item in enumerate(given):
        if not isinstance(item, dict):
            raise _bad_item(i, "must be an object")
        match item.get("type", "message"):
            case "message":
                messages.append(_message(i, item))
            case "function_call":
                call = _tool_call(i, item)
                last = messages[-1] if messages else None
                if last is not None and last["role"] == "assistant":
                    last.setdefault("tool_calls", []).append(call)
                else:
                    messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            case "function_call_output":
                call_id = _string(i, item, "call_id")
                output = item.get("output")
                content = output if isinstance(output, str) else _text(i, output, "output")
                messages.append({"role": "tool", "tool_call_id": call_id, "content": content})
            case "item_reference":
                raise _unsupported(
                    f"input[{i}] is an item_reference: responses are not stored here, send the "
                    "item itself",
                    "input",
                )
            case kind:
                raise _unsupported(
                    f"input[{i}] is of type {str(kind)[:40]!r}: served are messages, "
                    "function_call and function_call_output items",
                    "input",
                )
    return messages


def _message(i: int, item: dict[str, Any]) -> dict[str, Any]:
    role = _ROLES.get(str(item.get("role")))
    if role is None:
        raise _bad_item(i, f"has role {str(item.get('role'))[:40]!r}: {', '.join(_ROLES)} serve")
    content = item.get("content")
    text = content if isinstance(content, str) else _text(i, content, "content")
    return {"role": role, "content": text}


def _text(i: int, parts: Any, field: str) -> str:
    """The text of a list of content parts; only text parts are served."""
    if not isinstance(parts, list) or not all(isinstance(p, dict) for p in parts):
        raise _bad_item(i, f"needs `{field}` as a string or a list of content parts")
    kinds = {str(p.get("type")) for p in parts} - _TEXT_PARTS
    if kinds:
        raise _unsupported(
            f"input[{i}] holds content of type {', '.join(sorted(kinds))[:80]}: only text is "
            "supported",
            "input",
        )
    texts = [p.get("text", p.get("refusal")) for p in parts]
    if not all(isinstance(t, str) for t in texts):
        raise _bad_item(i, "has a text part without its text")
    return "".join(texts)


def _tool_call(i: int, item: dict[str, Any]) -> dict[str, Any]:
    function = {"name": _string(i, item, "name"), "arguments": _string(i, item, "arguments")}
    return {"id": _string(i, item, "call_id"), "type": "function", "function": function}


def _string(i: int, item: dict[str, Any], field: str) -> str:
    value = item.get(field)
    if not isinstance(value, str):
        raise _bad_item(i, f"needs `{field}` as a string")
    return value


def _bad_item(i: int, what: str) -> BatchLineRefused:
    return BatchLineRefused(LineCode.INVALID_BODY, f"input[{i}] {what}", param="input")


def _chat_tool(i: int, tool: dict[str, Any]) -> dict[str, Any]:
    kind = tool.get("type")
    if kind != "function":
        raise _unsupported(
            f"tools[{i}] is of type {str(kind)[:40]!r}: only function tools are supported "
            "(hosted tools run at OpenAI)",
            "tools",
        )
    fields = ("name", "description", "parameters", "strict")
    return {"type": "function", "function": {k: tool[k] for k in fields if k in tool}}


def _chat_tool_choice(choice: str | dict[str, Any]) -> str | dict[str, Any]:
    if isinstance(choice, str):
        return choice
    if choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise _unsupported(
        f"tool_choice of type {str(choice.get('type'))[:40]!r} is not supported: send "
        '"auto", "none", "required" or {"type": "function", "name": ...}',
        "tool_choice",
    )


def _response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    given = (text or {}).get("format")
    if given is None:
        return None
    kind = given.get("type") if isinstance(given, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        assert isinstance(given, dict)
        fields = ("name", "schema", "strict", "description")
        return {"type": "json_schema", "json_schema": {k: given[k] for k in fields if k in given}}
    raise BatchLineRefused(
        LineCode.INVALID_BODY,
        'text.format.type must be "text", "json_object" or "json_schema"',
        param="text",
    )


def _echo(asked: ResponsesBody) -> dict[str, Any]:
    """What a Response repeats of its request (OpenAI's defaults where not given)."""
    return {
        "instructions": asked.instructions,
        "metadata": asked.metadata or {},
        "tools": asked.tools or [],
        "tool_choice": asked.tool_choice or "auto",
        "parallel_tool_calls": asked.parallel_tool_calls is not False,
        "temperature": asked.temperature,
        "top_p": asked.top_p,
        "max_output_tokens": asked.max_output_tokens,
        "text": {"format": (asked.text or {}).get("format") or {"type": "text"}},
        "truncation": asked.truncation or "disabled",
        "previous_response_id": None,
        "reasoning": None,
        "store": False,  # nothing is stored: a later `previous_response_id` is refused
    }
