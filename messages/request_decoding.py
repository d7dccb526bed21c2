"""Untrusted bytes → `GenerateRequest`, or an `UndecodableRequest` with the right error code.

This is the ingest's first gate: whatever arrives on the topic (garbage, a 10 MB blob, JSON of
the wrong shape) becomes either a request or a typed error, never an exception of another kind.
"""

from __future__ import annotations

from typing import Any

import msgspec

from messages.codec import JSON, Codec, normalize_content_type
from messages.error_codes import ErrorCode
from messages.errors import UndecodableRequest, UnsupportedContentType
from messages.limits import MAX_ID_BYTES, MAX_KEY_BYTES
from messages.request import GenerateRequest

DEFAULT_MAX_REQUEST_BYTES = 1 << 20  # 1 MiB

_codec = Codec(GenerateRequest)
_loose_json = msgspec.json.Decoder()
_loose_msgpack = msgspec.msgpack.Decoder()
_JSON_KINDS = {
    list: "an array",
    str: "a string",
    int: "a number",
    float: "a number",
    bool: "a boolean",
    type(None): "null",
}


def decode_request(
    data: bytes | None,
    content_type: str | bytes | None = None,
    *,
    max_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    key: bytes | None = None,
) -> GenerateRequest:
    """Decode one record value (and check its `key`). Raises `UndecodableRequest` (with a code)
    on any failure; the limits are those of `messages.limits`."""
    if key is not None and len(key) > MAX_KEY_BYTES:
        raise UndecodableRequest(
            ErrorCode.KEY_TOO_LARGE,
            f"the record key is {len(key)} bytes; the limit is {MAX_KEY_BYTES}",
        )
    if data is None:
        raise UndecodableRequest(ErrorCode.INVALID_JSON, "the record has no value (a tombstone)")
    if len(data) > max_bytes:
        raise UndecodableRequest(
            ErrorCode.MESSAGE_TOO_LARGE,
            f"the request is {len(data)} bytes; the limit is {max_bytes}",
        )
    try:
        ctype = normalize_content_type(content_type)
    except UnsupportedContentType as exc:
        raise UndecodableRequest(ErrorCode.UNSUPPORTED_CONTENT_TYPE, str(exc)) from None
    if ctype == JSON:
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UndecodableRequest(
                ErrorCode.INVALID_ENCODING,
                f"the request is not UTF-8 text (byte {exc.start}); send JSON or set "
                "content-type: application/msgpack",
            ) from None
    try:
        request = _codec.decode(data, ctype)
    except msgspec.ValidationError as exc:
        _raise_shape_error(data, ctype, str(exc))
    except (msgspec.DecodeError, RecursionError) as exc:  # deep nesting: RecursionError
        code = ErrorCode.INVALID_JSON if ctype == JSON else ErrorCode.INVALID_ENCODING
        raise UndecodableRequest(code, f"cannot decode the request: {exc}") from None
    if not request.id:
        raise UndecodableRequest(
            ErrorCode.MISSING_ID,
            "the request has no `id` (or an empty one); results are keyed by it",
            reply_to=request.reply_to,
        )
    if len(request.id.encode()) > MAX_ID_BYTES:
        raise UndecodableRequest(
            ErrorCode.ID_TOO_LONG,
            f"the request's `id` is {len(request.id.encode())} bytes of UTF-8; the limit is "
            f"{MAX_ID_BYTES} (results are keyed by it)",
            reply_to=request.reply_to,
        )
    return request


def _raise_shape_error(data: bytes, ctype: str, problem: str) -> None:
    """The bytes parsed but do not fit the schema: salvage `id`/`reply_to` for the reply."""
    try:
        loose: Any = _loose_json.decode(data) if ctype == JSON else _loose_msgpack.decode(data)
    except (msgspec.DecodeError, RecursionError) as exc:  # deep nesting: RecursionError
        code = ErrorCode.INVALID_JSON if ctype == JSON else ErrorCode.INVALID_ENCODING
        raise UndecodableRequest(code, f"cannot decode the request: {exc}") from None
    if not isinstance(loose, dict):
        kind = _JSON_KINDS.get(type(loose), type(loose).__name__)
        raise UndecodableRequest(
            ErrorCode.INVALID_JSON, f"a request must be an object, got {kind}"
        ) from None
    request_id = loose.get("id")
    if isinstance(request_id, str) and len(request_id.encode()) > MAX_ID_BYTES:
        request_id = ""  # not echoed: it would make the error result unbounded
    reply_to = loose.get("reply_to")
    raise UndecodableRequest(
        ErrorCode.SCHEMA_VIOLATION,
        f"the request does not match the schema: {problem}",
        request_id=request_id if isinstance(request_id, str) else "",
        reply_to=reply_to if isinstance(reply_to, str) and reply_to else None,
    ) from None
