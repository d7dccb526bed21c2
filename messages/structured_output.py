"""`StructuredOutput`: a constraint on the output beyond JSON (vLLM's `structured_outputs`).

    {"regex": "[A-Z]{3}-[0-9]{2}"}          # the whole output matches the regular expression
    {"choice": ["positive", "negative"]}    # the output is exactly one of these strings
    {"grammar": "start: ..."}               # the output is a sentence of a Lark (or GBNF) grammar

Give exactly one field. JSON goes in `response_format` (`messages.response_format`), and a
request gives at most one constraint: a constrained `response_format` or this. The worker
decodes under a grammar compiled from it, so a result that finished with "stop" matches it;
"length" means it was cut off.

A regex is the regex crate's syntax (Rust's: no look-around, no backreferences), matched
against the whole output (no `^`/`$` needed). A grammar is Lark as the grammar library reads it
(llguidance's: `start` is the start rule, `/regex/` terminals) or GBNF
(llama.cpp's, `root ::= ...`). The sizes are checked at the door (`check_structured_output`,
limits in `messages.limits`); whether the grammar library can compile the regex or grammar is
checked by the engine that will run it. Both answer `invalid_response_format`.
"""

from __future__ import annotations

import json
from typing import Literal

import msgspec

from messages.error_codes import ErrorCode
from messages.errors import InvalidRequest
from messages.limits import (
    MAX_CHOICE_STRING_CHARS,
    MAX_CHOICE_STRINGS,
    MAX_GRAMMAR_CHARS,
    MAX_REGEX_CHARS,
)
from messages.response_format import ResponseFormat

FIELDS = ("regex", "choice", "grammar")
RuleKind = Literal["regex", "choice", "grammar"]


class StructuredOutput(
    msgspec.Struct, kw_only=True, forbid_unknown_fields=False, omit_defaults=True
):
    """Exactly one of `regex`, `choice`, `grammar` (see the module's docstring)."""

    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None

    @property
    def given(self) -> list[str]:
        return [name for name in FIELDS if getattr(self, name) is not None]

    def rule(self) -> tuple[RuleKind, str]:
        """What the engine compiles: the kind and its text (a choice as a JSON list, which is
        how the grammar library reads it). Only for a checked request: exactly one field."""
        if self.regex is not None:
            return "regex", self.regex
        if self.choice is not None:
            return "choice", json.dumps(self.choice)
        assert self.grammar is not None, "an unchecked structured_output"
        return "grammar", self.grammar


def check_structured_output(
    structured: StructuredOutput | None, response_format: ResponseFormat | None
) -> None:
    """Raise `InvalidRequest(INVALID_RESPONSE_FORMAT)` unless `structured` is well formed and
    the request gives at most one constraint."""
    if structured is None:
        return
    given = structured.given
    if len(given) != 1:
        found = ", ".join(given) if given else "none"
        raise _invalid(
            f"structured_output takes exactly one of {', '.join(FIELDS)} (found: {found}); "
            "a JSON schema goes in response_format"
        )
    if response_format is not None and response_format.constrained:
        raise _invalid(
            f"give at most one constraint: response_format of type {response_format.type!r} "
            f"and structured_output.{given[0]}"
        )
    if structured.regex is not None:
        _check_text("regex", structured.regex, MAX_REGEX_CHARS)
    if structured.grammar is not None:
        _check_text("grammar", structured.grammar, MAX_GRAMMAR_CHARS)
    if structured.choice is not None:
        choices = structured.choice
        if not 1 <= len(choices) <= MAX_CHOICE_STRINGS:
            raise _invalid(
                f"structured_output.choice must list 1 to {MAX_CHOICE_STRINGS} strings, "
                f"got {len(choices)}"
            )
        for i, choice in enumerate(choices):
            if not 1 <= len(choice) <= MAX_CHOICE_STRING_CHARS:
                raise _invalid(
                    f"structured_output.choice[{i}] must be 1 to {MAX_CHOICE_STRING_CHARS} "
                    f"characters, got {len(choice)}"
                )


def _check_text(name: str, text: str, limit: int) -> None:
    if not 1 <= len(text) <= limit:
        raise _invalid(f"structured_output.{name} must be 1 to {limit} characters, got {len(text)}")


def _invalid(message: str) -> InvalidRequest:
    return InvalidRequest(ErrorCode.INVALID_RESPONSE_FORMAT, message)
