"""Encoding and decoding by content type: JSON by default, MessagePack when the header says so.

One `Codec` per message type, built once: msgspec's encoders and decoders are reusable and
fastest that way.
"""

from __future__ import annotations

from typing import Generic, TypeVar

import msgspec

from messages.errors import UnsupportedContentType

JSON = "application/json"
MSGPACK = "application/msgpack"
_MSGPACK_ALIASES = frozenset({MSGPACK, "application/x-msgpack", "application/vnd.msgpack"})

T = TypeVar("T")


def normalize_content_type(value: str | bytes | None) -> str:
    """The canonical content type for a header value; no header means JSON."""
    if value is None:
        return JSON
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    base = text.split(";", 1)[0].strip().lower()
    if base in ("", JSON, "text/json"):
        return JSON
    if base in _MSGPACK_ALIASES:
        return MSGPACK
    raise UnsupportedContentType(f"content-type {text!r} is not supported; use {JSON} or {MSGPACK}")


_json_encoder = msgspec.json.Encoder()
_msgpack_encoder = msgspec.msgpack.Encoder()


def encode(message: msgspec.Struct, content_type: str = JSON) -> bytes:
    """Any message, in the wire format `content_type` names (normalized): for a value that
    may be of several types (a `GenerateResult` or an `EmbedResult`)."""
    if content_type == MSGPACK:
        return _msgpack_encoder.encode(message)
    return _json_encoder.encode(message)


class Codec(Generic[T]):
    """Encode/decode one message type as JSON or MessagePack.

    `decode` raises msgspec's `ValidationError` (right syntax, wrong shape) or `DecodeError`
    (not JSON / MessagePack at all); callers that face untrusted bytes classify those.
    """

    def __init__(self, type_: type[T]) -> None:
        self.type = type_
        self._json_encoder = msgspec.json.Encoder()
        self._json_decoder = msgspec.json.Decoder(type_)
        self._msgpack_encoder = msgspec.msgpack.Encoder()
        self._msgpack_decoder = msgspec.msgpack.Decoder(type_)

    def encode(self, message: T, content_type: str = JSON) -> bytes:
        if content_type == MSGPACK:
            return self._msgpack_encoder.encode(message)
        return self._json_encoder.encode(message)

    def decode(self, data: bytes, content_type: str = JSON) -> T:
        if content_type == MSGPACK:
            return self._msgpack_decoder.decode(data)
        return self._json_decoder.decode(data)
