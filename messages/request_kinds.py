"""The two kinds of request on a requests topic, and which kind a record is.

    kind = request_kind(value, content_type, schema)   # "generate" | "embed"

A worker serves one kind (its model's: a generative model answers `GenerateRequest`s, an
embedding model `EmbedRequest`s) and answers the other with `unsupported_task`. A record says
its kind in the `tokenmill-schema` header (`EmbedRequest/1`, `GenerateRequest/1`); one
without the header is an embedding request when its body has `input` and none of `prompt`,
`prompt_token_ids` and `messages` (`messages.embedding`), else a generation request, as
producers have always sent them.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from messages import headers as h
from messages.codec import MSGPACK
from messages.embedding import EmbedRequest, EmbedResult
from messages.request import GenerateRequest
from messages.result import GenerateResult

RequestKind = Literal["generate", "embed"]
Request = GenerateRequest | EmbedRequest
Result = GenerateResult | EmbedResult

REQUEST_TYPES: dict[RequestKind, type[GenerateRequest] | type[EmbedRequest]] = {
    "generate": GenerateRequest,
    "embed": EmbedRequest,
}
RESULT_SCHEMAS: dict[type[Result], str] = {
    GenerateResult: h.RESULT_SCHEMA,
    EmbedResult: h.EMBED_RESULT_SCHEMA,
}


def kind_of(request: Request) -> RequestKind:
    return "embed" if isinstance(request, EmbedRequest) else "generate"


class _Fields(msgspec.Struct, forbid_unknown_fields=False):
    """The fields that tell a header-less record's kind, kept raw (never decoded)."""

    input: msgspec.Raw = msgspec.Raw(b"")
    prompt: msgspec.Raw = msgspec.Raw(b"")
    prompt_token_ids: msgspec.Raw = msgspec.Raw(b"")
    messages: msgspec.Raw = msgspec.Raw(b"")


_fields_json = msgspec.json.Decoder(_Fields)
_fields_msgpack = msgspec.msgpack.Decoder(_Fields)
_ABSENT = (b"", b"null", b"\xc0")  # not there, or null (JSON, MessagePack): as if absent
_EMBED_SCHEMA = h.EMBED_REQUEST_SCHEMA.encode()
_GENERATE_SCHEMA = h.GENERATE_REQUEST_SCHEMA.encode()


def request_kind(data: bytes | None, content_type: str, schema: bytes | None) -> RequestKind:
    """The kind of a request record: its `schema` header's (`messages.headers.SCHEMA`), or
    the body's rule when it has none of ours. `content_type`: the normalized one. A body that
    is not an object of the wire format is a generation request (refused as it always was)."""
    if schema is not None:
        name = schema.strip()
        if name == _EMBED_SCHEMA:
            return "embed"
        if name == _GENERATE_SCHEMA:
            return "generate"
    if not data:
        return "generate"
    decoder = _fields_msgpack if content_type == MSGPACK else _fields_json
    try:
        found = decoder.decode(data)
    except (msgspec.DecodeError, RecursionError):  # a shape error is a DecodeError too
        return "generate"
    prompts = (found.prompt, found.prompt_token_ids, found.messages)
    if bytes(found.input) in _ABSENT or any(bytes(raw) not in _ABSENT for raw in prompts):
        return "generate"
    return "embed"
