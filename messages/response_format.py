"""`ResponseFormat`: the shape a request's output must take (OpenAI's `response_format`).

    {"type": "text"}                                   # no constraint (the default)
    {"type": "json_object"}                            # any JSON object
    {"type": "json_schema", "json_schema": {"name": "person", "schema": {...}, "strict": true}}

The worker constrains decoding with a grammar compiled from it, so a result that finished with
"stop" parses as JSON (and validates against the schema); "length" means the JSON was cut off.
The structural rules are checked at the door (`check_response_format`); whether the grammar
library can compile the schema is checked by the engine that will run it. Both answer
`invalid_response_format`.

A schema must be plain JSON: objects with string keys, arrays, strings, booleans, null,
integers in int64 and finite floats, nested at most `MAX_SCHEMA_DEPTH` deep. MessagePack can
carry more (bytes, extension types, timestamps, NaN, integers up to 2**64), and JSON deeper
nesting than anything downstream walks; such a schema is refused, never raised on.
"""

from __future__ import annotations

import json
import math
from typing import Any

import msgspec

from messages.error_codes import ErrorCode
from messages.errors import InvalidRequest
from messages.limits import INT64_LIMIT, MAX_SCHEMA_DEPTH, cut

TEXT = "text"
JSON_OBJECT = "json_object"
JSON_SCHEMA = "json_schema"
TYPES = (TEXT, JSON_OBJECT, JSON_SCHEMA)

MAX_SCHEMA_CHARS = 64 * 1024  # a schema's canonical JSON text; compiled per distinct schema


class JsonSchemaFormat(
    msgspec.Struct, kw_only=True, forbid_unknown_fields=False, omit_defaults=True
):
    """OpenAI's `json_schema` object. `strict`: every keyword must be enforced (a schema with
    one the grammar library cannot enforce is refused); otherwise such keywords are ignored."""

    name: str = ""
    description: str | None = None
    schema: dict[str, Any] | None = None  # None: any JSON value, as OpenAI's default
    strict: bool | None = None


class ResponseFormat(msgspec.Struct, kw_only=True, forbid_unknown_fields=False, omit_defaults=True):
    """`type` is one of "text", "json_object", "json_schema" (which needs `json_schema`)."""

    type: str = TEXT
    json_schema: JsonSchemaFormat | None = None

    @property
    def constrained(self) -> bool:
        return self.type != TEXT

    def schema_text(self) -> str | None:
        """The JSON Schema the output must match, as compact JSON text (the engine's cache
        key; keys keep their order, which is the order of the output's properties); None
        for "text". Raises `InvalidRequest` for a schema that is not plain JSON (refused at
        the door, so never after it)."""
        if self.type == JSON_OBJECT:
            return canonical({"type": "object"})
        if self.type == JSON_SCHEMA and self.json_schema is not None:
            return canonical(self.json_schema.schema if self.json_schema.schema is not None else {})
        return None

    @property
    def strict(self) -> bool:
        return bool(self.json_schema is not None and self.json_schema.strict)


def canonical(schema: Any) -> str:
    """`schema` as compact JSON text; `InvalidRequest(INVALID_RESPONSE_FORMAT)` unless it is
    plain JSON (`check_plain_json`), on which `json.dumps` cannot fail."""
    check_plain_json(schema)
    return json.dumps(schema, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def check_plain_json(value: Any) -> None:
    """Raise `InvalidRequest(INVALID_RESPONSE_FORMAT)` unless `value` is plain JSON (see the
    module's docstring), naming the first offending place. Iterative: any depth is refused,
    never a `RecursionError`."""
    # Each entry: a value, the number of arrays and objects around it, and its trail (the
    # parent's trail and its key or index; rendered as a path only for a message).
    stack: list[tuple[Any, int, tuple[Any, ...]]] = [(value, 0, ())]
    while stack:
        item, depth, trail = stack.pop()
        if item is None or isinstance(item, str | bool):
            continue
        if isinstance(item, int):
            if not -INT64_LIMIT <= item < INT64_LIMIT:
                raise _invalid(f"the schema has an integer outside int64 at {_path(trail)}")
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise _invalid(f"the schema has {item} at {_path(trail)}, which JSON cannot hold")
        elif isinstance(item, dict | list):
            if depth >= MAX_SCHEMA_DEPTH:
                raise _invalid(
                    f"the schema nests deeper than {MAX_SCHEMA_DEPTH} arrays and objects "
                    f"(at {_path(trail)})"
                )
            if isinstance(item, list):
                stack.extend((child, depth + 1, (trail, i)) for i, child in enumerate(item))
                continue
            for key, child in item.items():
                if not isinstance(key, str):
                    raise _invalid(
                        f"the schema has a key of type {type(key).__name__} at {_path(trail)}; "
                        "JSON keys are strings"
                    )
                stack.append((child, depth + 1, (trail, key)))
        else:
            raise _invalid(
                f"the schema has a value of type {type(item).__name__} at {_path(trail)}, which "
                "JSON cannot hold"
            )


def _path(trail: tuple[Any, ...]) -> str:
    """A trail of `check_plain_json` as a JSONPath, `$.properties.tags[0]`."""
    steps: list[str] = []
    while trail:
        trail, step = trail
        steps.append(f"[{step}]" if isinstance(step, int) else f".{cut(step, 64)}")
    return cut("$" + "".join(reversed(steps)), 160)


def check_response_format(response_format: ResponseFormat | None) -> None:
    """Raise `InvalidRequest(INVALID_RESPONSE_FORMAT)` unless the format is well formed."""
    if response_format is None:
        return
    kind = response_format.type
    if kind not in TYPES:
        raise _invalid(f"response_format.type must be one of {', '.join(TYPES)}, got {kind!r}")
    if kind == JSON_SCHEMA and response_format.json_schema is None:
        raise _invalid("response_format of type json_schema needs `json_schema`")
    text = response_format.schema_text()
    if text is not None and len(text) > MAX_SCHEMA_CHARS:
        raise _invalid(f"the schema is {len(text)} characters, over {MAX_SCHEMA_CHARS}")


def _invalid(message: str) -> InvalidRequest:
    return InvalidRequest(ErrorCode.INVALID_RESPONSE_FORMAT, message)
