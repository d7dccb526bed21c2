"""Render a model's Jinja chat template, the way Hugging Face tokenizers do.

jinja2 is a dependency of torch itself, so this adds nothing to what `gpu/` needs installed.

Tools (`tools=`, OpenAI-style `{"type": "function", "function": {...}}` dicts) and earlier
tool turns (an assistant message's `tool_calls`, `tool` messages) are rendered by the
template's own tool support, as `apply_chat_template(tools=...)` passes them; a template with
no tool format (`messages.tool_formats.detect_format`) gets them as plain messages instead
(`messages.tool_prompt`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

from jinja2 import Template
from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from messages.tool_formats import ToolFormat, detect_format
from messages.tool_prompt import default_tool_messages


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    """Plain `json.dumps`, as Hugging Face's templates get it (Jinja's own `tojson` escapes
    HTML characters and sorts keys, which a tool's schema shown to the model must not)."""
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


@lru_cache(maxsize=8)
def _compile(template: str) -> Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.filters["tojson"] = _tojson
    return env.from_string(template)


def render_chat(
    template: str,
    messages: Sequence[dict[str, Any]],
    *,
    add_generation_prompt: bool,
    bos_token: str,
    eos_token: str,
    tools: Sequence[dict[str, Any]] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> str:
    """Render, or raise ValueError saying why the template refused the messages.

    `tools`: the functions the model may call (a template with no tool format gets them in
    tokenmill's default format instead); `extra`: more variables for the template (a request's
    `chat_template_kwargs`); the names above keep their values whatever `extra` holds.
    """
    messages = list(messages)
    if _has_tool_turns(messages, tools) and detect_format(template) is ToolFormat.DEFAULT:
        messages, tools = default_tool_messages(messages, tools), None
    try:
        variables = {
            **(extra or {}),
            "messages": messages,
            "tools": list(tools) if tools else None,
            "add_generation_prompt": add_generation_prompt,
            "bos_token": bos_token,
            "eos_token": eos_token,
        }
        return _compile(template).render(variables)
    except TemplateError as exc:
        raise ValueError(f"the chat template failed: {exc}") from exc


def open_final_message(rendered: str, content: str) -> str:
    """`rendered` cut right after the last message's `content`, so the model continues that
    message instead of closing it (what the template writes after it, an end-of-turn token,
    is dropped). ValueError when the template does not write the content as given."""
    text = content.rstrip()
    at = rendered.rfind(text) if text else -1
    if at < 0:
        raise ValueError(
            "continue_final_message: the chat template does not write the last message's "
            "content as given, so it cannot be continued"
        )
    return rendered[: at + len(text)]


def _has_tool_turns(messages: Sequence[dict[str, Any]], tools: Sequence[Any] | None) -> bool:
    return bool(tools) or any(m.get("role") == "tool" or m.get("tool_calls") for m in messages)
