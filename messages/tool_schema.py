"""The JSON Schema of one tool call: `{"name": <a tool's name>, "arguments": <its parameters>}`.

Standard library only: the worker's grammar compiler (`gpu/`) builds calls' grammars with it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

# What `parameters` means when a function has none: no arguments (OpenAI's reading).
NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}


def call_schema(
    functions: Sequence[tuple[str, dict[str, Any] | None]],
    *,
    at: str = "#",
    arguments: str = "arguments",
) -> dict[str, Any]:
    """The JSON Schema of one call of any of `functions` ((name, parameters) pairs, the
    parameters a JSON Schema or None for none): name first, then its arguments under the key
    `arguments`. `at`: where the schema will sit in the document its local references resolve
    against (its root, by default)."""
    one = len(functions) == 1
    calls = []
    for i, (name, parameters) in enumerate(functions):
        where = f"{at}/properties/{arguments}" if one else f"{at}/anyOf/{i}/properties/{arguments}"
        parameters = parameters if parameters is not None else NO_PARAMETERS
        calls.append(
            {
                "type": "object",
                "properties": {
                    "name": {"const": name},
                    arguments: _moved(parameters, where),
                },
                "required": ["name", arguments],
                "additionalProperties": False,
            }
        )
    return calls[0] if one else {"anyOf": calls}


def _moved(schema: dict[str, Any], at: str) -> dict[str, Any]:
    """`schema` with its local references (`#/$defs/x`, `#`) pointing where it now sits (`at`),
    a copy. (An `enum` or `const` value holding a `$ref` key would be rewritten too: a schema
    keyword as data, which no tool schema is expected to carry.)"""
    copy: dict[str, Any] = json.loads(json.dumps(schema))  # plain JSON: checked before
    stack: list[Any] = [copy]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            ref = item.get("$ref")
            if isinstance(ref, str) and ref.startswith("#"):
                item["$ref"] = at + ref[1:]
            stack.extend(item.values())
    return copy
