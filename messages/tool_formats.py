"""A model's own tool-call format: found in its chat template, and the grammar of an "auto" answer.

    fmt = detect_format(tokenizer.chat_template)     # a ToolFormat
    lark = auto_grammar(fmt, functions, parallel=True, special={})

The format is read from the template's text, as the template writes earlier calls:

- `hermes`: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks after optional
  text (Qwen2.5, Qwen3, Hermes 2/3): the template holds `<tool_call>`;
- `mistral`: `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]` (the template holds
  `[TOOL_CALLS]`);
- `llama3_json`: the whole answer is one `{"name": ..., "parameters": {...}}`, after an
  optional `<|python_tag|>` (Llama 3.1/3.2/3.3: the template holds `<|python_tag|>`, or
  `<|start_header_id|>` with `"parameters"`);
- `default`: a template with none of these (SmolLM2's and Gemma 3's render role and text
  only). tokenmill renders the tools itself (`messages.tool_prompt`) and asks for the
  `hermes` block: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

The grammar (Lark as llguidance reads it) lets the answer be free text (which may end at any
point: EOS is allowed wherever a plain answer may end), or text then calls in the format, each
call's JSON constrained to `{"name": <a tool's name>, "arguments": <that tool's parameters>}`
(`messages.tool_schema.call_schema`): once the model writes the format's opening marker, the
call is valid JSON of one of the tools. A marker that is a special token of the model's
vocabulary (`special`: its text → its id) is matched as that token (it can then never appear
in the free text); a textual marker is kept out of the free text by the grammar itself, so
the free text cannot hold a call the grammar did not check.

Pure functions, standard library only (the worker's grammar compiler uses them): no I/O.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping, Sequence
from typing import Any

from messages.tool_schema import call_schema


class ToolFormat(enum.StrEnum):
    HERMES = "hermes"
    MISTRAL = "mistral"
    LLAMA3_JSON = "llama3_json"
    DEFAULT = "default"  # the template has no tool format: tokenmill's own (hermes blocks)


HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
MISTRAL_OPEN = "[TOOL_CALLS]"
PYTHON_TAG = "<|python_tag|>"
# Whitespace allowed between two calls (bounded: a model cannot spin on it forever).
_BETWEEN = r"[ \t\r\n]{0,4}"


def detect_format(template: str | None) -> ToolFormat:
    """The tool-call format `template` (a Jinja chat template) writes calls in."""
    text = template or ""
    if MISTRAL_OPEN in text:
        return ToolFormat.MISTRAL
    if HERMES_OPEN in text:
        return ToolFormat.HERMES
    if PYTHON_TAG in text or ("<|start_header_id|>" in text and '"parameters"' in text):
        return ToolFormat.LLAMA3_JSON
    return ToolFormat.DEFAULT


def arguments_key(fmt: ToolFormat) -> str:
    """The key a call's arguments object is under in `fmt`."""
    return "parameters" if fmt is ToolFormat.LLAMA3_JSON else "arguments"


def markers(fmt: ToolFormat) -> tuple[str, ...]:
    """The marker texts of `fmt` that may be special tokens of a vocabulary."""
    match fmt:
        case ToolFormat.HERMES | ToolFormat.DEFAULT:
            return (HERMES_OPEN, HERMES_CLOSE)
        case ToolFormat.MISTRAL:
            return (MISTRAL_OPEN,)
        case ToolFormat.LLAMA3_JSON:
            return (PYTHON_TAG,)


def auto_grammar(
    fmt: ToolFormat,
    functions: Sequence[tuple[str, dict[str, Any] | None]],
    *,
    parallel: bool,
    special: Mapping[str, int],
    lenient: bool = True,
) -> str:
    """The Lark grammar of an answer under tool_choice "auto": free text, or (text then) one
    call, or with `parallel` one or more, in `fmt`. `functions`: (name, parameters) pairs;
    `special`: the format's markers that are
    special tokens of the vocabulary, by text. `lenient`: ignore schema keywords the grammar
    cannot enforce (every tool not `strict`) instead of refusing the schema."""
    options = {"whitespace_flexible": False, "lenient": lenient}
    key = arguments_key(fmt)
    if fmt is ToolFormat.MISTRAL:
        calls = call_schema(list(functions), at="#/items", arguments=key)
        schema: dict[str, Any] = {"type": "array", "items": calls, "minItems": 1}
        if not parallel:
            schema["maxItems"] = 1
        schema["x-guidance"] = options
        body = f"calls: %json {json.dumps(schema)}"
        return _text_then(MISTRAL_OPEN, "calls", special) + "\n" + body + "\n"
    schema = {**call_schema(list(functions), arguments=key), "x-guidance": options}
    call = f"call: %json {json.dumps(schema)}"
    if fmt is ToolFormat.LLAMA3_JSON:
        tag = f"{_lit(PYTHON_TAG, special)}? " if PYTHON_TAG in special else ""
        return "\n".join(
            [
                f"start: TEXT | {tag}call |",
                r"TEXT: /[^{\s](?s:.*)/",  # text never opens with `{`: that is a call
                call,
                "",
            ]
        )
    # hermes and default: text, then <tool_call> blocks.
    close = _lit(HERMES_CLOSE, special)
    block = f'"\\n"? call "\\n"? {close}'
    more = f" (SEP {block})*" if parallel else ""
    if HERMES_OPEN in special:
        opener = _lit(HERMES_OPEN, special)
        more = more.replace("SEP", "sep")  # a special token may not be in a terminal
        lines = [
            f"start: TEXT | TEXT? {opener} {block}{more}",
            r"TEXT: /(?s:.+)/",
            f"sep: /{_BETWEEN}/ {opener}" if parallel else "",
        ]
    else:
        lines = [
            f"start: TEXT | head {block}{more}",
            _free_text(HERMES_OPEN),
            f"head[lazy]: /(?s:.*){_regex(HERMES_OPEN)}/",
            f"SEP: /{_BETWEEN}{_regex(HERMES_OPEN)}/" if parallel else "",
        ]
    return "\n".join([*lines, call, ""])


def _text_then(marker: str, rule: str, special: Mapping[str, int]) -> str:
    """`start`: free text, or text then `marker` then `rule`."""
    if marker in special:
        return "\n".join(
            [f"start: TEXT | TEXT? {_lit(marker, special)} {rule}", r"TEXT: /(?s:.+)/"]
        )
    return "\n".join(
        [
            f"start: TEXT | head {rule}",
            _free_text(marker),
            f"head[lazy]: /(?s:.*){_regex(marker)}/",
        ]
    )


def _free_text(marker: str) -> str:
    """Any text that does not hold `marker` (which would start a call)."""
    return f"TEXT: /(?s:.*)/ & ~/(?s:.*){_regex(marker)}(?s:.*)/"


def _lit(text: str, special: Mapping[str, int]) -> str:
    """`text` in a rule: its special token, or the string."""
    if text in special:
        return f"<[{special[text]}]>"
    return json.dumps(text)


def _regex(text: str) -> str:
    """`text` as a literal inside `/.../`."""
    out = []
    for char in text:
        if char.isalnum() or char in "_ <>=:,-\"'":
            out.append(char)
        else:
            out.append("\\" + char)
    return "".join(out)


def constraint_text(
    functions: Sequence[tuple[str, dict[str, Any] | None]], *, parallel: bool, lenient: bool
) -> str:
    """What a "tools" constraint carries to the worker's grammar compiler (its cache key):
    the tools as (name, parameters), and the two options of `auto_grammar`."""
    return json.dumps(
        {"tools": [list(f) for f in functions], "parallel": parallel, "lenient": lenient},
        separators=(",", ":"),
    )


def read_constraint(text: str) -> tuple[list[tuple[str, dict[str, Any] | None]], bool, bool]:
    """`constraint_text`'s functions, `parallel` and `lenient`, read back."""
    data = json.loads(text)
    functions = [(str(name), parameters) for name, parameters in data["tools"]]
    return functions, bool(data["parallel"]), bool(data["lenient"])
