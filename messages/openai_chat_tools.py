"""A chat body's turns and tools → the request's fields (part of the batch mapper,
`messages.openai_batch_mapping`, which calls `chat_message` for each turn and `with_tools`
for the body).

    fields |= {"messages": [chat_message(m) for m in chat.messages]}
    fields = with_tools(chat, fields)

Tools are rendered by the chat template (the request's `tools`); "required" or a named choice
constrains the output to one call's JSON, "auto" (the default with tools) lets the model answer
in text or calls in its own format (`tool_calling`, `messages.tool_formats`). How the answer
reads calls rides in the request's metadata (`TOOLS_KEY`). The legacy `functions` and
`function_call` are read as tools. Refusals carry `openai_batch_mapping.LineCode` values,
written as strings here (that module imports this one). Pure functions: no I/O.
"""

from __future__ import annotations

from typing import Any

from messages.error_codes import ErrorCode
from messages.errors import BatchLineRefused
from messages.openai_batch import ChatCompletionBody, ChatMessageIn
from messages.openai_guided import constraint_fields
from messages.openai_tools import NamedFunction, NamedTool, Tool, ToolCall, tool_call_format
from messages.request import ChatMessage, ToolCalling

# How a chat with tools is answered: "required" (the output is one call's JSON) or "auto" (text
# or calls in the model's format), + FUNCTIONS_SUFFIX when asked with the legacy `functions`.
TOOLS_KEY = "openai.tools"
FUNCTIONS_SUFFIX = "+functions"


def with_tools(chat: ChatCompletionBody, fields: dict[str, Any]) -> dict[str, Any]:
    """`fields` with the chat's constraint and its tools: rendered by the chat template
    (`tools`), a forced call's JSON constraint, or under "auto" `tool_calling`; how the
    answer reads calls in the metadata (`TOOLS_KEY`)."""
    tools, choice, legacy = _tools_asked(chat)
    tool_call = tool_call_format(tools, choice)
    fields |= constraint_fields(chat, response_format=chat.response_format, tool_call=tool_call)
    if not tools or choice == "none":
        return fields
    fields["tools"] = tools
    mode = "required" if tool_call is not None else "auto"
    if mode == "auto":
        shape = fields.get("response_format")
        if "structured_output" in fields or (shape is not None and shape.constrained):
            raise BatchLineRefused(
                ErrorCode.INVALID_RESPONSE_FORMAT,
                'give at most one constraint: tools (tool_choice "auto") and a constrained '
                "response_format or structured output",
                param="tools",
            )
        parallel = chat.parallel_tool_calls is not False and not legacy
        fields["tool_calling"] = ToolCalling(parallel=parallel)
    fields.setdefault("metadata", {})[TOOLS_KEY] = mode + (FUNCTIONS_SUFFIX if legacy else "")
    return fields


def _tools_asked(
    chat: ChatCompletionBody,
) -> tuple[list[Tool] | None, str | NamedTool | None, bool]:
    """The chat's tools and tool_choice, the legacy `functions`/`function_call` read as them,
    and whether they were given the legacy way."""
    if chat.functions is None and chat.function_call is None:
        return chat.tools, chat.tool_choice, False
    if chat.tools is not None or chat.tool_choice is not None:
        raise BatchLineRefused(
            "invalid_body",
            "give `tools` and `tool_choice`, or the legacy `functions` and `function_call`, "
            "not both",
            param="functions",
        )
    tools = [Tool(function=f) for f in chat.functions] if chat.functions is not None else None
    choice = chat.function_call
    if isinstance(choice, NamedFunction):
        return tools, NamedTool(function=choice), True
    return tools, choice, True


def chat_message(message: ChatMessageIn) -> ChatMessage:
    """A turn as the request carries it: its text, an assistant's calls (the legacy
    `function_call` as one call) and a tool result's id; a legacy `function` turn (a
    function's result) is a `tool` turn."""
    calls = message.tool_calls
    if message.function_call is not None and not calls:
        call = message.function_call
        calls = [ToolCall(id=f"call_{call.name}", function=call)]
    role = "tool" if message.role == "function" else message.role
    return ChatMessage(
        role=role,
        content=_text_of(message),
        tool_calls=calls or None,
        tool_call_id=message.tool_call_id,
        name=message.name,
    )


def _text_of(message: ChatMessageIn) -> str:
    if message.content is None or isinstance(message.content, str):
        return message.content or ""
    kinds = {part.type for part in message.content} - {"text"}
    if kinds:
        raise BatchLineRefused(
            "unsupported_parameter",
            f"message content of type {', '.join(sorted(kinds))}: only text is supported",
            param="messages",
        )
    return "".join(part.text or "" for part in message.content)
