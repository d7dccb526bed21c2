"""HTTP bodies ⇄ tokenmill messages, through the batch mapper: ONE mapping for both doors.

A `POST /v1/chat/completions` body is mapped exactly as a batch line with that `url` and
`body` (`messages.openai_batch_mapping.to_request`), and a result is answered with the body the
batch output line carries (`answer_line`), with the status it assigns. Only `stream` is the
gateway's own: the batch mapper refuses it (a file has no one to stream to), so it is taken out
before mapping and set on the request after.

Two things differ from a batch file, as OpenAI's clients expect of an HTTP API: omitted fields
take OpenAI's meaning (`to_request`'s `openai_defaults`: a chat runs to EOS, sampling takes the
model's recommended values), and a field the mapper does not know is ignored, logged
(`request_fields_ignored`, names only) and named in `Asked.ignored`, which the routes answer in
the `x-tokenmill-ignored-fields` header; `strict_fields` refuses it instead (400
`unsupported_parameter`, as a batch file does).

`/v1/embeddings` bodies go the same way through the embeddings mapping
(`messages.openai_embeddings`, as a batch line to that url): `to_embed_asked`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import msgspec
import structlog
from fastapi import Request

from messages import openai_embeddings
from messages.embedding import EmbedRequest
from messages.errors import BatchLineRefused, InvalidRequest
from messages.openai_batch import EMBEDDINGS_URL, BatchInputLine
from messages.openai_batch_answers import answer_line
from messages.openai_batch_mapping import LineCode, calls_tool, to_request, unknown_fields
from messages.request import GenerateRequest
from messages.result import GenerateResult
from messages.validation import check_request
from ops.gateway.errors import ApiError, too_large

_decoder = msgspec.json.Decoder()
log = structlog.get_logger(__name__)
IGNORED_FIELDS_HEADER = "x-tokenmill-ignored-fields"
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
_MAX_IGNORED = 32


@dataclass(frozen=True)
class Asked:
    """One HTTP request, mapped: the message to send and how to answer it."""

    url: str
    request: GenerateRequest
    stream: bool
    include_usage: bool  # `stream_options.include_usage`
    tool_call: bool  # answered as `tool_calls` (`calls_tool`)
    ignored: tuple[str, ...] = ()  # body fields left out as unknown (`IGNORED_FIELDS_HEADER`)

    @property
    def ignored_header(self) -> dict[str, str]:
        """The response header naming `ignored` (none when nothing was)."""
        return _ignored_header(self.ignored)


@dataclass(frozen=True)
class EmbedAsked:
    """One `/v1/embeddings` request, mapped."""

    request: EmbedRequest
    ignored: tuple[str, ...] = ()  # as `Asked.ignored`

    @property
    def ignored_header(self) -> dict[str, str]:
        return _ignored_header(self.ignored)


def _ignored_header(ignored: tuple[str, ...]) -> dict[str, str]:
    return {IGNORED_FIELDS_HEADER: ",".join(ignored)} if ignored else {}


def parse_body(raw: bytes) -> dict[str, Any]:
    """The JSON object of a request body; `ApiError` 400 `invalid_json` otherwise."""
    try:
        body = _decoder.decode(raw)
    except msgspec.DecodeError as exc:
        raise ApiError(400, f"the body is not JSON: {exc}", code=LineCode.INVALID_JSON) from None
    except RecursionError:
        raise ApiError(400, "the body is nested too deeply", code=LineCode.INVALID_JSON) from None
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object", code=LineCode.INVALID_JSON)
    return body


def to_asked(
    url: str,
    body: dict[str, Any],
    request_id: str,
    *,
    default_max_tokens: int | None = None,
    strict_fields: bool = False,
) -> Asked:
    """Map `body` as the batch mapper maps a line to `url`, with OpenAI's defaults; `ApiError`
    400 with the mapper's (or the door's) code for what it refuses. Unknown fields are ignored
    (`Asked.ignored`), or refused with `strict_fields`."""
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise ApiError(400, "`stream` must be a boolean", code="invalid_body", param="stream")
    options = body.get("stream_options")
    include_usage = isinstance(options, dict) and options.get("include_usage") is True
    line = BatchInputLine(
        custom_id=request_id,
        url=url,
        body={k: v for k, v in body.items() if k != "stream"},
    )
    try:
        request = to_request(
            line,
            request_id,
            default_max_tokens=default_max_tokens,
            openai_defaults=True,
            ignore_unknown=not strict_fields,
        )
    except BatchLineRefused as exc:
        raise ApiError.refused(exc) from None
    ignored = () if strict_fields else _printable(unknown_fields(line))
    if ignored:
        log.info("request_fields_ignored", request_id=request_id, url=url, fields=list(ignored))
    tool_call = calls_tool(line)
    if stream:
        # The prompt's part of an answer comes only with the result: it is not streamed.
        echo, scored = bool(body.get("echo")), request.prompt_logprobs is not None
        if param := "echo" if echo else "prompt_logprobs" if scored else None:
            raise ApiError(
                400,
                f"`{param}` with `stream: true` is not supported: ask without streaming",
                code=LineCode.UNSUPPORTED_PARAMETER,
                param=param,
            )
        request.stream = True
        try:
            check_request(request)  # the request's rules, now with `stream` set
        except InvalidRequest as exc:
            raise ApiError(400, exc.message, code=str(exc.code), param="stream") from None
    return Asked(url, request, bool(stream), include_usage, tool_call, ignored)


def to_embed_asked(
    body: dict[str, Any], request_id: str, *, strict_fields: bool = False
) -> EmbedAsked:
    """Map a `/v1/embeddings` body as a batch line to that url is mapped; `ApiError` 400 with
    the mapping's code for what it refuses. Unknown fields as `to_asked` treats them."""
    line = BatchInputLine(custom_id=request_id, url=EMBEDDINGS_URL, body=body)
    try:
        request = openai_embeddings.to_embed_request(
            line, request_id, ignore_unknown=not strict_fields
        )
    except BatchLineRefused as exc:
        raise ApiError.refused(exc) from None
    ignored = () if strict_fields else _printable(openai_embeddings.unknown_fields(line))
    if ignored:
        log.info("request_fields_ignored", request_id=request_id, url=EMBEDDINGS_URL,
                 fields=list(ignored))  # fmt: skip
    return EmbedAsked(request, ignored)


def _printable(names: tuple[str, ...]) -> tuple[str, ...]:
    """`names` as a header and a log may carry them: a client's key that is no plain name
    (control characters, non-ASCII, too long) is shown as "?"; at most `_MAX_IGNORED`."""
    shown = tuple(n if _PLAIN_NAME.fullmatch(n) else "?" for n in names[:_MAX_IGNORED])
    return shown + (("…",) if len(names) > _MAX_IGNORED else ())


def answer(asked: Asked, result: GenerateResult, created: int) -> tuple[int, Any]:
    """The HTTP status and body for `result`, as the batch output line carries them."""
    line = answer_line(
        asked.request.id, asked.url, result, created=created, tool_call=asked.tool_call
    )
    assert line.response is not None
    return line.response.status_code, msgspec.to_builtins(line.response.body)


async def read_body(request: Request, limit: int) -> bytes:
    """The body, read no further than `limit` bytes (413 past it)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large(limit)
    parts, size = [], 0
    async for part in request.stream():
        size += len(part)
        if size > limit:
            raise too_large(limit)
        parts.append(part)
    return b"".join(parts)
