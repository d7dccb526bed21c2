"""A chat completion's answer as a Response (`POST /v1/responses`), and the parts both the
whole and the streamed Response are made of.

    response = to_response(asked, completion, "resp_…")

The chat message's text is one `message` item holding an `output_text` part; its tool calls are
`function_call` items (`call_id` the chat call's id, `arguments` its JSON text). `status` is
"incomplete", with `incomplete_details.reason` "max_output_tokens", when the run stopped at its
token limit. `usage` is chat's in the Responses names. Pure functions: no I/O.
"""

from __future__ import annotations

from typing import Any

from messages.openai_responses import ResponsesAsked


def response_object(
    asked: ResponsesAsked,
    *,
    response_id: str,
    created_at: int,
    model: str,
    status: str,
    output: list[dict[str, Any]],
    usage: dict[str, Any] | None = None,
    finish_reason: str | None = None,
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A Response: its envelope, `output` items, `usage` (chat's, converted) and why it is
    incomplete (from the chat `finish_reason`)."""
    reason = _INCOMPLETE.get(finish_reason or "")
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "error": error,
        "incomplete_details": {"reason": reason} if status == "incomplete" and reason else None,
        "model": model,
        "output": output,
        "usage": response_usage(usage) if usage is not None else None,
        **asked.echo,
    }


# Chat finish reasons that leave a Response incomplete, and OpenAI's reason for each.
_INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}


def status_of(finish_reason: str | None) -> str:
    """A Response's (and its items') status for the chat run's `finish_reason`."""
    if finish_reason in _INCOMPLETE:
        return "incomplete"
    if finish_reason == "cancelled":
        return "cancelled"
    return "completed"


def response_usage(usage: dict[str, Any]) -> dict[str, Any]:
    """Chat's `usage` in the Responses names."""
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return {
        "input_tokens": usage.get("prompt_tokens", 0),
        # tokens written to a prompt cache are not counted here
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": usage.get("completion_tokens", 0),
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.get("total_tokens", 0),
    }


def message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    """An assistant `message` output item holding one `output_text` part."""
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {
        "id": item_id,
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": [part],
    }


def call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    """A `function_call` output item."""
    return {
        "id": item_id,
        "type": "function_call",
        "status": status,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }


def to_response(
    asked: ResponsesAsked, completion: dict[str, Any], response_id: str
) -> dict[str, Any]:
    """The Response for a `chat.completion` body (its first choice)."""
    choice = completion["choices"][0]
    message = choice.get("message") or {}
    finish = choice.get("finish_reason")
    status = status_of(finish)
    calls = message.get("tool_calls") or []
    text = message.get("content") or ""
    base = response_id.removeprefix("resp_")
    output = [message_item(f"msg_{base}", text, status)] if text or not calls else []
    for i, call in enumerate(calls):
        function = call.get("function") or {}
        output.append(
            call_item(
                f"fc_{base}_{i}",
                call.get("id", f"call_{base}_{i}"),
                function.get("name", ""),
                function.get("arguments", ""),
                status,
            )
        )
    return response_object(
        asked,
        response_id=response_id,
        created_at=int(completion.get("created", 0)),
        model=str(completion.get("model", "")),
        status=status,
        output=output,
        usage=completion.get("usage"),
        finish_reason=finish,
    )
