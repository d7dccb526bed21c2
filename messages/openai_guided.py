"""The constraint a batch line's body asks for, as a request's `response_format` or
`structured_output`.

A body may name its constraint in any of the fields users' files carry:

    "structured_outputs": {"json": <schema or its text>}  # vLLM's; or "regex", "choice",
                                                          # "grammar", "json_object": true
    "guided_json", "guided_regex", "guided_choice", "guided_grammar"  # vLLM's older names
    "response_format": {...}                              # OpenAI's (chat)
    "tools" with "tool_choice"                            # OpenAI's (chat; `openai_tools`)

At most one of them (a body with two is refused, never one of them silently dropped). JSON
becomes `response_format` (vLLM's guided JSON is not strict: a keyword the grammar cannot
enforce is ignored, as vLLM's fallback does); regex, choice and grammar become
`structured_output`. The constraint's own rules (sizes, a well-formed format) are checked with
the request's (`messages.validation`); whether it compiles, by the engine.

Pure functions: no I/O.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from messages.error_codes import ErrorCode
from messages.errors import BatchLineRefused
from messages.openai_batch import ChatCompletionBody, CompletionBody
from messages.response_format import JsonSchemaFormat, ResponseFormat
from messages.structured_output import StructuredOutput

GUIDED = ("guided_json", "guided_regex", "guided_choice", "guided_grammar")
# vLLM's structured_outputs keys that cannot change a tokenmill answer: its fallback between
# grammar backends (there is one), and no whitespace in JSON (tokenmill's JSON has none).
_HARMLESS_KEYS = frozenset({"disable_fallback", "disable_any_whitespace"})


class StructuredOutputs(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    """vLLM's `structured_outputs` object (the keys tokenmill serves)."""

    json: dict[str, Any] | str | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None


def constraint_fields(
    body: CompletionBody | ChatCompletionBody,
    *,
    response_format: dict[str, Any] | None = None,
    tool_call: ResponseFormat | None = None,
) -> dict[str, Any]:
    """The request fields of `body`'s one constraint (none: {}). `response_format`: a chat's,
    as given; `tool_call`: the format of a chat's tools (`openai_tools.tool_call_format`).
    Raises `BatchLineRefused` for two constraints or one that cannot be read."""
    fields: dict[str, Any] = {}
    found: list[tuple[str, dict[str, Any]]] = []  # (where the body gives it, request fields)
    if response_format is not None:
        shape = _response_format(response_format)
        fields["response_format"] = shape  # "text" too: its rules are checked with the rest
        if shape.constrained:
            found.append(("response_format", {"response_format": shape}))
    if tool_call is not None:
        found.append(("tools", {"response_format": tool_call}))
    if body.structured_outputs is not None:
        given = _structured_outputs(body.structured_outputs)
        for key in StructuredOutputs.__struct_fields__:
            value = getattr(given, key)
            if value is not None and value is not False:
                param = f"structured_outputs.{key}"
                found.append((param, _fields(key, value, param)))
    for name in GUIDED:
        value = getattr(body, name)
        if value is not None:
            found.append((name, _fields(name.removeprefix("guided_"), value, name)))
    if len(found) > 1:
        names = ", ".join(name for name, _ in found)
        raise BatchLineRefused(
            ErrorCode.INVALID_RESPONSE_FORMAT,
            f"give at most one constraint (found: {names})",
            param=found[1][0].split(".")[0],
        )
    if found:
        fields.update(found[0][1])
    return fields


def _fields(kind: str, value: Any, param: str) -> dict[str, Any]:
    if kind == "json":
        schema = _schema(value, param)
        shape = JsonSchemaFormat(name="structured_outputs", schema=schema, strict=False)
        return {"response_format": ResponseFormat(type="json_schema", json_schema=shape)}
    if kind == "json_object":
        return {"response_format": ResponseFormat(type="json_object")}
    return {"structured_output": StructuredOutput(**{kind: value})}


def _schema(value: dict[str, Any] | str, param: str) -> dict[str, Any]:
    """A JSON schema given as an object or as its text (vLLM takes both)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            raise BatchLineRefused(
                ErrorCode.INVALID_RESPONSE_FORMAT,
                f"`{param}` is text that is not JSON",
                param=param.split(".")[0],
            ) from None
    if not isinstance(value, dict):
        raise BatchLineRefused(
            ErrorCode.INVALID_RESPONSE_FORMAT,
            f"`{param}` must be a JSON schema object",
            param=param.split(".")[0],
        )
    return value


def _structured_outputs(body: dict[str, Any]) -> StructuredOutputs:
    try:
        given = msgspec.convert(body, StructuredOutputs)
    except msgspec.ValidationError as exc:
        raise BatchLineRefused(
            ErrorCode.INVALID_RESPONSE_FORMAT,
            f"structured_outputs: {exc}",
            param="structured_outputs",
        ) from None
    for key, value in body.items():
        known = key in StructuredOutputs.__struct_fields__ or key in _HARMLESS_KEYS
        if not known and value is not None and value is not False:
            raise BatchLineRefused(
                "unsupported_parameter",  # openai_batch_mapping.LineCode's
                f"`structured_outputs.{key[:64]}` is not supported",
                param="structured_outputs",
            )
    return given


def _response_format(body: dict[str, Any]) -> ResponseFormat:
    """OpenAI's `response_format` as tokenmill's; its rules are checked with the request's."""
    try:
        return msgspec.convert(body, ResponseFormat)
    except msgspec.ValidationError as exc:
        raise BatchLineRefused(
            ErrorCode.INVALID_RESPONSE_FORMAT, f"response_format: {exc}", param="response_format"
        ) from None
