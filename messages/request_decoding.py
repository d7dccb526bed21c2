"""Untrusted bytes → a request (`GenerateRequest` or `EmbedRequest`, by the record's kind:
`messages.request_kinds`), or an `UndecodableRequest` with the right error code.

This is the ingest's first gate: whatever arrives on the topic (garbage, a 10 MB blob, JSON of
the wrong shape) becomes either a request or a typed error, never an exception of another kind.

A repeated key is refused: msgspec keeps the last of them silently, and another reader of the
same record could keep the first. In JSON every object is checked; in MessagePack the
request's own map.
"""

from __future__ import annotations

import json
import re
from typing import Any

import msgspec

from messages.codec import JSON, Codec, normalize_content_type
from messages.error_codes import ErrorCode
from messages.errors import UndecodableRequest, UnsupportedContentType
from messages.limits import MAX_ID_BYTES, MAX_KEY_BYTES, cut
from messages.request_kinds import REQUEST_TYPES, Request, RequestKind, request_kind

DEFAULT_MAX_REQUEST_BYTES = 1 << 20  # 1 MiB

_codecs: dict[RequestKind, Codec[Any]] = {kind: Codec(t) for kind, t in REQUEST_TYPES.items()}
_loose_json = msgspec.json.Decoder()
_loose_msgpack = msgspec.msgpack.Decoder()
_msgpack_entries = msgspec.msgpack.Decoder(list[msgspec.Raw])
_msgpack_key = msgspec.msgpack.Decoder(str)
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
    kind: RequestKind | None = None,
) -> Request:
    """Decode one record value (and check its `key`). Raises `UndecodableRequest` (with a code)
    on any failure; the limits are those of `messages.limits`.

    `kind`: which request the record is (`messages.request_kinds.request_kind`, from its schema
    header and body); None: the body's rule decides."""
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
    text = None
    if ctype == JSON:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UndecodableRequest(
                ErrorCode.INVALID_ENCODING,
                f"the request is not UTF-8 text (byte {exc.start}); send JSON or set "
                "content-type: application/msgpack",
            ) from None
    kind = kind or request_kind(data, ctype, None)
    try:
        request: Request = _codecs[kind].decode(data, ctype)
    except msgspec.ValidationError as exc:
        _raise_shape_error(data, ctype, str(exc), kind)
    except (msgspec.DecodeError, RecursionError) as exc:  # deep nesting: RecursionError
        code = ErrorCode.INVALID_JSON if ctype == JSON else ErrorCode.INVALID_ENCODING
        raise UndecodableRequest(code, f"cannot decode the request: {exc}") from None
    _refuse_repeated_keys(data, text, request)
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


def _refuse_repeated_keys(data: bytes, text: str | None, request: Request) -> None:
    """Raise `UndecodableRequest` if the record repeats a key: in any JSON object (`text`, the
    record as JSON), or in the MessagePack map of the request. Runs once msgspec read the
    record, so a failure here is a disagreement between decoders, refused all the same."""
    code = ErrorCode.INVALID_JSON if text is not None else ErrorCode.INVALID_ENCODING
    try:
        key = _repeated_json_key(text) if text is not None else _repeated_msgpack_key(data)
    except Exception as exc:  # json refusing what msgspec read (depth, digits): never raised
        raise UndecodableRequest(code, f"cannot decode the request: {exc}") from None
    if key is None:
        return
    # The id and reply_to are echoed unless they are what is ambiguous.
    raise UndecodableRequest(
        code,
        f"the request repeats the key {cut(key, 64)!r}; decoders disagree on which one counts",
        request_id=request.id if key != "id" and len(request.id.encode()) <= MAX_ID_BYTES else "",
        reply_to=request.reply_to if key != "reply_to" and request.reply_to else None,
    )


class _RepeatedKey(Exception):
    def __init__(self, key: str) -> None:
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> None:
    """`json.loads`' object hook: raise `_RepeatedKey` for an object that repeats a key (the
    objects themselves are not needed)."""
    if len(dict(pairs)) < len(pairs):
        raise _RepeatedKey(_first_repeated([key for key, _ in pairs]) or "")


# Built once. Only the keys matter: `len` stands in for building each number (a third faster
# on a list of token ids).
_json_pairs = json.JSONDecoder(object_pairs_hook=_unique_keys, parse_int=len, parse_float=len)


def _repeated_json_key(text: str) -> str | None:
    """The first key some object of the JSON `text` repeats."""
    try:
        _json_pairs.decode(text)
    except _RepeatedKey as exc:
        return exc.key
    return None


def _repeated_msgpack_key(data: bytes) -> str | None:
    """The first key the MessagePack map `data` repeats. Its header becomes an array header
    of twice the count, so msgspec reads the entries as keys and values in turn."""
    first, view = data[0], memoryview(data)
    if 0x80 <= first <= 0x8F:  # fixmap
        count, body = first & 0x0F, view[1:]
    elif first == 0xDE:  # map 16
        count, body = int.from_bytes(data[1:3], "big"), view[3:]
    elif first == 0xDF:  # map 32
        count, body = int.from_bytes(data[1:5], "big"), view[5:]
    else:
        raise ValueError(f"a request is a map, not the MessagePack type 0x{first:02x}")
    entries = _msgpack_entries.decode(b"\xdd" + (2 * count).to_bytes(4, "big") + body)
    return _first_repeated([_msgpack_key.decode(key) for key in entries[::2]])


def _first_repeated(keys: list[str]) -> str | None:
    seen: set[str] = set()
    for key in keys:
        if key in seen:
            return key
        seen.add(key)
    return None


# Where msgspec says an embedding request's `input` breaks its type (a list of lists of
# texts, a number alone): the request's own rule, answered `invalid_prompt`, not dead-lettered.
_INPUT_PATH = re.compile(r"- at `\$\.input(\[\d+\])*`$")


def _raise_shape_error(data: bytes, ctype: str, problem: str, kind: RequestKind) -> None:
    """The bytes parsed but do not fit the schema: salvage `id`/`reply_to` for the reply."""
    try:
        loose: Any = _loose_json.decode(data) if ctype == JSON else _loose_msgpack.decode(data)
    except (msgspec.DecodeError, RecursionError) as exc:  # deep nesting: RecursionError
        code = ErrorCode.INVALID_JSON if ctype == JSON else ErrorCode.INVALID_ENCODING
        raise UndecodableRequest(code, f"cannot decode the request: {exc}") from None
    if not isinstance(loose, dict):
        got = _JSON_KINDS.get(type(loose), type(loose).__name__)
        raise UndecodableRequest(
            ErrorCode.INVALID_JSON, f"a request must be an object, got {got}"
        ) from None
    request_id = loose.get("id")
    if isinstance(request_id, str) and len(request_id.encode()) > MAX_ID_BYTES:
        request_id = ""  # not echoed: it would make the error result unbounded
    reply_to = loose.get("reply_to")
    code, message = ErrorCode.SCHEMA_VIOLATION, f"the request does not match the schema: {problem}"
    if kind == "embed" and _INPUT_PATH.search(problem):
        code = ErrorCode.INVALID_PROMPT
        message = (
            "`input` must be a text, a list of texts, a list of token ids or a list of lists of "
            f"token ids ({problem})"
        )
    raise UndecodableRequest(
        code,
        message,
        request_id=request_id if isinstance(request_id, str) else "",
        reply_to=reply_to if isinstance(reply_to, str) and reply_to else None,
    ) from None
