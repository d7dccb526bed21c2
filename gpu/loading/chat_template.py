"""Render a model's Jinja chat template, the way Hugging Face tokenizers do.

jinja2 is a dependency of torch itself, so this adds nothing to what `gpu/` needs installed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

from jinja2 import Template
from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=8)
def _compile(template: str) -> Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(template)


def render_chat(
    template: str,
    messages: Sequence[dict[str, Any]],
    *,
    add_generation_prompt: bool,
    bos_token: str,
    eos_token: str,
    extra: Mapping[str, Any] | None = None,
) -> str:
    """Render, or raise ValueError saying why the template refused the messages.

    `extra`: more variables for the template (a request's `chat_template_kwargs`); the names
    above keep their values whatever `extra` holds.
    """
    try:
        variables = {
            **(extra or {}),
            "messages": list(messages),
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
