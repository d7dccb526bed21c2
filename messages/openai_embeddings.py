"""OpenAI's embeddings API ⇄ tokenmill's embedding messages: a `/v1/embeddings` body (an HTTP
request's, or a batch line's) → `EmbedRequest`, an `EmbedResult` → OpenAI's embeddings list.

    request = to_embed_request(line, "batch-1f2e-7")      # or BatchLineRefused
    body = embedding_list(result)                         # an ok result's answer

The body, as OpenAI's: `input` (a text, a list of texts, a list of token ids, or a list of lists
of token ids; at most `MAX_EMBED_INPUTS` inputs, none empty), `model`, `encoding_format`
("float", or "base64": each vector's float32 values, little-endian, base64-encoded, made by the
worker) and `dimensions` (Matryoshka truncation, checked against the model by the worker);
`user` is ignored. The extras other servers take:

- `prompt_name` (TEI, sentence-transformers): one of the model's task prompts, put before each
  text ("query", "document", ...).
- `truncate`: what an over-long input does. TEI's boolean (true: cut to the model's limit, at
  the end unless TEI's `truncation_direction` is "left"; false: refuse) or the wire's own value
  ("none", "end", "start"; `messages.embedding.Truncate`).
- `truncate_prompt_tokens` (vLLM): -1 cuts to the model's limit, from the side vLLM's
  `truncation_side` names ("left", vLLM's default: the input's last tokens are kept, wire
  "start"; "right": its first ones, "end"). A positive k (keep k tokens) is refused: the wire
  cuts only at the model's limit.
- `priority` (vLLM: lower runs earlier), as for generation.

Nothing given: an over-long input is refused (`prompt_too_long`), as OpenAI refuses it. Unknown
fields are refused in a batch file and ignored at the gateway's door (`ignore_unknown`), as for
generation. Pure functions: no I/O.
"""

from __future__ import annotations

import re
from typing import Any, Literal

import msgspec

from messages.embedding import EmbedInput, EmbedRequest, EmbedResult, Truncate
from messages.error_codes import ErrorCode
from messages.errors import BatchLineRefused, InvalidRequest
from messages.openai_batch import BatchInputLine
from messages.openai_batch_mapping import HARMLESS, LineCode
from messages.validation import check_embed_request

_PATH = re.compile(r"(?:at `\$\.|missing required field `)([A-Za-z_]+)")  # the field at fault
_FORMATS = ("float", "base64")
_WIRE_TRUNCATE = ("none", "end", "start")
_SIDES: dict[str, Truncate] = {"left": "start", "right": "end"}
# The body field a broken request rule is about (`check_embed_request`'s codes).
_PARAMS = {
    ErrorCode.EMPTY_PROMPT: "input",
    ErrorCode.INVALID_PROMPT: "input",
    ErrorCode.TOKEN_OUT_OF_VOCABULARY: "input",
    ErrorCode.INVALID_DIMENSIONS: "dimensions",
}


class EmbeddingsBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    """`/v1/embeddings`: OpenAI's fields, then the extras TEI and vLLM take (module docstring).
    `input` as the wire types it (its rules: `check_embed_request`)."""

    input: EmbedInput
    model: str | None = None
    encoding_format: str | None = None
    dimensions: int | None = None
    user: str | None = None
    prompt_name: str | None = None
    truncate: bool | str | None = None
    truncation_direction: str | None = None  # TEI's, with `truncate: true`
    truncate_prompt_tokens: int | None = None  # vLLM's
    truncation_side: str | None = None  # vLLM's, with `truncate_prompt_tokens`
    priority: int | None = None  # vLLM's: lower runs earlier


class EmbeddingObject(msgspec.Struct, kw_only=True):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str  # str: base64 of the float32 values, little-endian


class EmbeddingUsage(msgspec.Struct, kw_only=True):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(msgspec.Struct, kw_only=True):
    """OpenAI's answer to `/v1/embeddings`: one `EmbeddingObject` per input, in input order."""

    object: Literal["list"] = "list"
    data: list[EmbeddingObject]
    model: str
    usage: EmbeddingUsage


def to_embed_request(
    line: BatchInputLine,
    request_id: str,
    *,
    model: str | None = None,
    ignore_unknown: bool = False,
) -> EmbedRequest:
    """The `EmbedRequest` for `line`'s `/v1/embeddings` body; `BatchLineRefused` (naming the
    line's `custom_id`) for a body it cannot be. `model` overrides the body's; `ignore_unknown`:
    fields this mapping does not know are left out (`unknown_fields`), not refused. The
    request's metadata carries the `custom_id`, so its result names the line it answers. The
    request is checked against the model-independent rules (`check_embed_request`: inputs of
    one kind, none empty, at most `MAX_EMBED_INPUTS`; `dimensions` positive; priority)."""
    try:
        body = _convert(line, ignore_unknown)
        fields: dict[str, Any] = {
            "id": request_id,
            "input": body.input,
            "model": model if model is not None else body.model,
            "dimensions": body.dimensions,
            "encoding_format": _format(body.encoding_format),
            "prompt_name": body.prompt_name or None,
            "truncate": _truncate(body),
            "metadata": {"custom_id": line.custom_id},
        }
        if body.priority is not None:
            fields["priority"] = -body.priority  # vLLM's lower-first; the wire's larger-first
        request = EmbedRequest(**fields)
        check_embed_request(request)
    except InvalidRequest as exc:
        param = _PARAMS.get(exc.code)
        raise BatchLineRefused(
            exc.code, exc.message, param=param, custom_id=line.custom_id
        ) from None
    except BatchLineRefused as exc:
        exc.custom_id = line.custom_id
        raise
    return request


def unknown_fields(line: BatchInputLine) -> tuple[str, ...]:
    """The fields of `line`'s body this mapping does not know (`HARMLESS` ones and nulls
    aside): those `to_embed_request` refuses, or leaves out with `ignore_unknown`."""
    known = EmbeddingsBody.__struct_fields__
    return tuple(
        name
        for name, value in line.body.items()
        if value is not None and name not in known and name not in HARMLESS
    )


def embedding_list(result: EmbedResult) -> EmbeddingList:
    """An ok `result` as OpenAI's answer. The vectors go as the worker wrote them (floats, or
    base64 when the request asked so), not copied."""
    return EmbeddingList(
        data=[EmbeddingObject(index=e.index, embedding=e.embedding) for e in result.data],
        model=result.model.name if result.model is not None else "",
        usage=EmbeddingUsage(
            prompt_tokens=result.usage.prompt_tokens, total_tokens=result.usage.total_tokens
        ),
    )


def _convert(line: BatchInputLine, ignore_unknown: bool) -> EmbeddingsBody:
    try:
        body = msgspec.convert(line.body, EmbeddingsBody)
    except msgspec.ValidationError as exc:
        found = _PATH.search(str(exc))
        raise BatchLineRefused(
            LineCode.INVALID_BODY, f"body: {exc}", param=found.group(1) if found else None
        ) from None
    except RecursionError:
        raise BatchLineRefused(LineCode.INVALID_BODY, "body: nested too deeply") from None
    if not ignore_unknown and (unknown := unknown_fields(line)):
        raise BatchLineRefused(
            LineCode.UNSUPPORTED_PARAMETER, f"`{unknown[0]}` is not supported", param=unknown[0]
        )
    return body


def _format(given: str | None) -> str:
    if given is None:
        return "float"
    if given not in _FORMATS:
        raise BatchLineRefused(
            LineCode.INVALID_BODY,
            f'`encoding_format` must be "float" or "base64", got {given[:40]!r}',
            param="encoding_format",
        )
    return given


def _truncate(body: EmbeddingsBody) -> Truncate:
    """The wire's `truncate` for TEI's `truncate` or vLLM's `truncate_prompt_tokens` (one)."""
    if body.truncate is not None and body.truncate_prompt_tokens is not None:
        raise BatchLineRefused(
            LineCode.INVALID_BODY,
            "give `truncate` or `truncate_prompt_tokens`, not both",
            param="truncate_prompt_tokens",
        )
    if body.truncate_prompt_tokens is not None:
        if body.truncate_prompt_tokens != -1:
            raise BatchLineRefused(
                LineCode.UNSUPPORTED_PARAMETER,
                "`truncate_prompt_tokens` must be -1 (cut to the model's limit): keeping fewer "
                "tokens than the model takes is not supported",
                param="truncate_prompt_tokens",
            )
        return _side(body.truncation_side, "truncation_side", "start")
    if isinstance(body.truncate, bool):
        return _side(body.truncation_direction, "truncation_direction", "end") if body.truncate \
            else "none"  # fmt: skip
    if body.truncate is None:
        return "none"
    if body.truncate not in _WIRE_TRUNCATE:
        raise BatchLineRefused(
            LineCode.INVALID_BODY,
            f'`truncate` must be true, false, "none", "end" or "start", got {body.truncate[:40]!r}',
            param="truncate",
        )
    wire: Truncate = body.truncate  # type: ignore[assignment]  # one of _WIRE_TRUNCATE
    return wire


def _side(given: str | None, param: str, default: Truncate) -> Truncate:
    """ "left" / "right" (any case: TEI writes "Left") as the wire's "start" / "end"."""
    if given is None:
        return default
    side = _SIDES.get(given.lower())
    if side is None:
        raise BatchLineRefused(
            LineCode.INVALID_BODY, f'`{param}` must be "left" or "right"', param=param
        )
    return side
