"""Tools for a chat template with no tool format of its own: tokenmill's default rendering.

    messages = default_tool_messages(messages, tools)   # then render with the template

A template that renders only each message's role and text (SmolLM2's, Gemma 3's) is given
plain messages that say what its own tool support would have:

- the tools go into the system message (merged after the conversation's own system text, or a
  new first message): each tool as one JSON line (`{"type": "function", "function": {...}}`,
  as the request gave it), and the format to call them in,
  `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (the `default` format of
  `messages.tool_formats`, whose grammar then constrains the calls);
- an earlier assistant turn's `tool_calls` become that text after its content, one block per
  call, the arguments as JSON;
- `tool` messages (a tool's result) become user text, `<tool_response>{...}</tool_response>`
  holding the call id and the result, consecutive ones (and a user message after them) in one
  user message, so the roles still alternate for templates that insist on it.

Messages are dicts as chat templates take them (`role`, `content`, `tool_calls` with
`function.arguments` a parsed object, `tool_call_id`, `name`). Standard library only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

INSTRUCTIONS = (
    "You can call the following tools. Each is described by one JSON object: its name, what "
    "it does and its parameters (a JSON Schema).\n{tools}\n\n"
    "To call a tool, answer with a block holding a JSON object with the tool's name and its "
    "arguments:\n"
    '<tool_call>{{"name": "<tool name>", "arguments": {{<arguments>}}}}</tool_call>\n'
    "Write one block per call. A tool's result comes back in a <tool_response> block. "
    "If no tool is needed, answer in text."
)


def default_tool_messages(
    messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None
) -> list[dict[str, Any]]:
    """`messages` with the tools and every tool turn as plain role-and-text messages."""
    out: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        if role == "tool":
            text = _tool_response(message)
            if out and out[-1]["role"] == "user" and out[-1].get("_tool"):
                out[-1]["content"] += "\n" + text
            else:
                out.append({"role": "user", "content": text, "_tool": True})
            continue
        plain: dict[str, Any] = {"role": role, "content": _text(message.get("content"))}
        if role == "assistant" and message.get("tool_calls"):
            blocks = [_call_block(call) for call in message["tool_calls"]]
            plain["content"] = "\n".join([plain["content"], *blocks]).lstrip("\n")
        if role == "user" and out and out[-1].get("_tool"):
            out[-1]["content"] += "\n" + plain["content"]
            out[-1].pop("_tool")
            continue
        out.append(plain)
    for message in out:
        message.pop("_tool", None)
    if tools:
        described = INSTRUCTIONS.format(
            tools="\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
        )
        if out and out[0]["role"] == "system":
            out[0]["content"] = f"{out[0]['content']}\n\n{described}".lstrip("\n")
        else:
            out.insert(0, {"role": "system", "content": described})
    return out


def _text(content: Any) -> str:
    return content if isinstance(content, str) else ""


def _call_block(call: Mapping[str, Any]) -> str:
    function = call.get("function", call)
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):  # a client's text that is not JSON: shown as given
        arguments_text = arguments
    else:
        arguments_text = json.dumps(arguments, ensure_ascii=False)
    name = json.dumps(function.get("name", ""), ensure_ascii=False)
    return f'<tool_call>{{"name": {name}, "arguments": {arguments_text}}}</tool_call>'


def _tool_response(message: Mapping[str, Any]) -> str:
    shown: dict[str, Any] = {}
    if message.get("tool_call_id"):
        shown["tool_call_id"] = message["tool_call_id"]
    if message.get("name"):
        shown["name"] = message["name"]
    shown["content"] = _text(message.get("content"))
    return f"<tool_response>{json.dumps(shown, ensure_ascii=False)}</tool_response>"
