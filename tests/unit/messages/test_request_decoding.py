"""decode_request: untrusted bytes become a request or an UndecodableRequest with its own code."""

from __future__ import annotations

import random
from datetime import UTC, datetime

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from messages.codec import JSON, MSGPACK
from messages.error_codes import ErrorCode
from messages.errors import UndecodableRequest
from messages.request import ChatMessage, GenerateRequest
from messages.request_decoding import DEFAULT_MAX_REQUEST_BYTES, decode_request

DEEP = 10_000  # nesting levels; msgspec recurses once per level
MSGPACK_ALIASES = [
    "application/msgpack",
    "application/x-msgpack",
    "application/vnd.msgpack",
    "Application/MsgPack; charset=binary",
    b"application/x-msgpack",
]


def refused(
    data: bytes | None, content_type: str | bytes | None = None, **kw: int
) -> UndecodableRequest:
    with pytest.raises(UndecodableRequest) as info:
        decode_request(data, content_type, **kw)
    assert info.value.message, "every refusal carries a message for people"
    assert str(info.value) == info.value.message
    return info.value


# --- not a request at all -------------------------------------------------------------------


def test_invalid_json() -> None:
    error = refused(b"{x")
    assert error.code is ErrorCode.INVALID_JSON
    assert "cannot decode the request" in error.message
    assert "malformed" in error.message
    assert (error.request_id, error.reply_to) == ("", None)


def test_binary_garbage_is_invalid_encoding() -> None:
    garbage = random.Random(0).randbytes(256)
    with pytest.raises(UnicodeDecodeError):
        garbage.decode("utf-8")  # the fixed seed gives bytes that are not UTF-8
    error = refused(garbage)
    assert error.code is ErrorCode.INVALID_ENCODING
    assert "not UTF-8" in error.message
    assert "application/msgpack" in error.message  # says what to do instead


def test_a_tombstone_has_no_value() -> None:
    error = refused(None)
    assert error.code is ErrorCode.INVALID_JSON
    assert "tombstone" in error.message


@pytest.mark.parametrize(
    ("data", "kind"),
    [
        (b"[1, 2]", "an array"),
        (b'"hello"', "a string"),
        (b"42", "a number"),
        (b"4.5", "a number"),
        (b"true", "a boolean"),
        (b"null", "null"),
    ],
)
def test_top_level_json_must_be_an_object(data: bytes, kind: str) -> None:
    error = refused(data)
    assert error.code is ErrorCode.INVALID_JSON
    assert error.message == f"a request must be an object, got {kind}"


def test_empty_value_is_invalid_json() -> None:
    assert refused(b"").code is ErrorCode.INVALID_JSON


@pytest.mark.parametrize(
    ("data", "content_type", "code"),
    [
        (b"[" * DEEP + b"]" * DEEP, JSON, ErrorCode.INVALID_JSON),
        (
            b'{"id": "r1", "prompt": "x", "extra": ' + b"[" * DEEP + b"]" * DEEP + b"}",
            JSON,
            ErrorCode.INVALID_JSON,
        ),
        (b"\x91" * DEEP + b"\xc0", MSGPACK, ErrorCode.INVALID_ENCODING),
    ],
    ids=["json-array", "json-unknown-field", "msgpack-array"],
)
def test_deeply_nested_input_is_refused_not_raised(
    data: bytes, content_type: str, code: ErrorCode
) -> None:
    assert refused(data, content_type).code is code


# --- the wrong shape: the id and reply_to are salvaged --------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "path"),
    [
        ("max_new_tokens", "x", "$.max_new_tokens"),
        ("prompt", 5, "$.prompt"),
        ("metadata", {"a": 1}, "$.metadata[...]"),
        ("messages", [{"role": "user"}], "$.messages[0]"),
        ("stop", "END", "$.stop"),
    ],
)
def test_wrong_types_are_schema_violations(field: str, value: object, path: str) -> None:
    body = {"id": "req-7", "reply_to": "my.replies", "prompt": "hi", field: value}
    error = refused(msgspec.json.encode(body))
    assert error.code is ErrorCode.SCHEMA_VIOLATION
    assert error.message.startswith("the request does not match the schema: ")
    assert path in error.message  # the field that is wrong is named
    assert error.request_id == "req-7"
    assert error.reply_to == "my.replies"


@pytest.mark.parametrize(
    ("body", "request_id", "reply_to"),
    [
        ({"id": 12, "reply_to": "r", "prompt": 5}, "", "r"),  # a non-string id is not salvaged
        ({"id": "a", "reply_to": 12, "prompt": 5}, "a", None),
        ({"id": "a", "reply_to": "", "prompt": 5}, "a", None),
        ({"id": "a", "prompt": 5}, "a", None),
    ],
)
def test_only_string_id_and_reply_to_are_salvaged(
    body: dict[str, object], request_id: str, reply_to: str | None
) -> None:
    error = refused(msgspec.json.encode(body))
    assert error.code is ErrorCode.SCHEMA_VIOLATION
    assert (error.request_id, error.reply_to) == (request_id, reply_to)


def test_schema_violation_salvages_from_msgpack_too() -> None:
    data = msgspec.msgpack.encode({"id": "m1", "reply_to": "out", "max_new_tokens": "x"})
    error = refused(data, MSGPACK)
    assert error.code is ErrorCode.SCHEMA_VIOLATION
    assert (error.request_id, error.reply_to) == ("m1", "out")


def test_naive_deadline_is_a_schema_violation() -> None:
    error = refused(b'{"id": "d", "prompt": "x", "deadline": "2030-01-01T00:00:00"}')
    assert error.code is ErrorCode.SCHEMA_VIOLATION
    assert "$.deadline" in error.message
    assert error.request_id == "d"


def test_deadline_with_a_zone_is_decoded() -> None:
    request = decode_request(b'{"id": "d", "prompt": "x", "deadline": "2030-01-01T00:00:00Z"}')
    assert request.deadline == datetime(2030, 1, 1, tzinfo=UTC)
    offset = decode_request(b'{"id": "d", "prompt": "x", "deadline": "2030-01-01T02:00:00+02:00"}')
    assert offset.deadline == request.deadline


# --- the id ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data", [b'{"prompt": "hi"}', b'{"id": "", "prompt": "hi"}'], ids=["missing", "empty"]
)
def test_missing_or_empty_id(data: bytes) -> None:
    error = refused(data)
    assert error.code is ErrorCode.MISSING_ID
    assert "`id`" in error.message


def test_missing_id_keeps_the_reply_to() -> None:
    error = refused(b'{"prompt": "hi", "reply_to": "team.replies"}')
    assert error.code is ErrorCode.MISSING_ID
    assert error.reply_to == "team.replies"


# --- size -----------------------------------------------------------------------------------


def test_a_10_mb_value_is_too_large() -> None:
    data = b'{"id": "big", "prompt": "' + b"a" * (10 * 1024 * 1024) + b'"}'
    error = refused(data)
    assert error.code is ErrorCode.MESSAGE_TOO_LARGE
    assert error.message == f"the request is {len(data)} bytes; the limit is {1 << 20}"
    assert DEFAULT_MAX_REQUEST_BYTES == 1 << 20


def test_the_size_limit_is_exact() -> None:
    prefix, suffix = b'{"id": "edge", "prompt": "', b'"}'
    limit = 100
    at_limit = prefix + b"a" * (limit - len(prefix) - len(suffix)) + suffix
    assert len(at_limit) == limit
    assert decode_request(at_limit, max_bytes=limit).id == "edge"
    over = prefix + b"a" * (limit + 1 - len(prefix) - len(suffix)) + suffix
    assert refused(over, max_bytes=limit).code is ErrorCode.MESSAGE_TOO_LARGE


def test_size_is_checked_before_the_content_type() -> None:
    assert refused(b"x" * 11, "text/plain", max_bytes=10).code is ErrorCode.MESSAGE_TOO_LARGE


# --- content types --------------------------------------------------------------------------


@pytest.mark.parametrize("content_type", ["text/plain", "application/xml", b"application/cbor"])
def test_unsupported_content_type(content_type: str | bytes) -> None:
    error = refused(b'{"id": "a", "prompt": "x"}', content_type)
    assert error.code is ErrorCode.UNSUPPORTED_CONTENT_TYPE
    assert "is not supported" in error.message
    assert JSON in error.message and MSGPACK in error.message


@pytest.mark.parametrize(
    "content_type", [None, "", "application/json", "text/json", "application/json; charset=utf-8"]
)
def test_json_content_types(content_type: str | None) -> None:
    assert decode_request(b'{"id": "a", "prompt": "x"}', content_type).prompt == "x"


FULL = GenerateRequest(
    id="round-trip",
    messages=[ChatMessage(role="user", content="héllo 👋")],
    max_new_tokens=7,
    temperature=0.7,
    top_p=0.9,
    top_k=40,
    seed=3,
    stop=["\n\n"],
    stop_token_ids=[2],
    model="smollm2-135m",
    priority=5,
    deadline=datetime(2030, 1, 1, 12, 30, tzinfo=UTC),
    timeout_ms=5000,
    reply_to="team.replies",
    metadata={"batch": "b-1"},
)


@pytest.mark.parametrize("content_type", MSGPACK_ALIASES)
def test_msgpack_round_trip(content_type: str | bytes) -> None:
    data = msgspec.msgpack.encode(FULL)
    assert decode_request(data, content_type) == FULL


def test_json_round_trip() -> None:
    assert decode_request(msgspec.json.encode(FULL)) == FULL


@pytest.mark.parametrize(
    "data",
    [
        msgspec.msgpack.encode(FULL)[:-3],  # truncated
        b"\xc1",  # a byte MessagePack never uses
        msgspec.msgpack.encode({"id": "a"}) + b"\x00",  # trailing bytes
    ],
    ids=["truncated", "reserved-byte", "trailing"],
)
def test_broken_msgpack_is_invalid_encoding(data: bytes) -> None:
    error = refused(data, MSGPACK)
    assert error.code is ErrorCode.INVALID_ENCODING
    assert "cannot decode the request" in error.message


def test_json_sent_as_msgpack_is_invalid_encoding() -> None:
    assert refused(b'{"id": "a"}', MSGPACK).code is ErrorCode.INVALID_ENCODING


# --- forward compatibility ------------------------------------------------------------------


def test_unknown_fields_are_ignored() -> None:
    data = (
        b'{"id": "new", "prompt": "x", "v": 2, "beam_width": 4, '
        b'"beam_search": {"top": 5, "of": [1, 2]}, "messages_v2": null}'
    )
    request = decode_request(data)
    assert (request.id, request.prompt, request.v) == ("new", "x", 2)
    msgpack = msgspec.msgpack.encode({"id": "new", "prompt": "x", "future": [1, {"a": b"b"}]})
    assert decode_request(msgpack, MSGPACK).id == "new"


def test_defaults_are_boring() -> None:
    request = decode_request(b'{"id": "a", "prompt": "x"}')
    assert (request.temperature, request.max_new_tokens, request.top_p, request.top_k) == (
        0.0,
        16,
        1.0,
        0,
    )
    assert request.v == 1
    assert (request.stop, request.metadata, request.reply_to) == ([], {}, None)


# --- whatever arrives -----------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    data=st.binary(max_size=512),
    content_type=st.sampled_from([None, JSON, MSGPACK, "text/plain"]),
)
def test_arbitrary_bytes_decode_or_refuse(data: bytes, content_type: str | None) -> None:
    try:
        request = decode_request(data, content_type)
    except UndecodableRequest as exc:
        assert isinstance(exc.code, ErrorCode)
        assert exc.message
    else:
        assert isinstance(request, GenerateRequest)
        assert request.id


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=8,
)
request_like = st.dictionaries(
    st.sampled_from(
        [
            "id",
            "prompt",
            "prompt_token_ids",
            "messages",
            "max_new_tokens",
            "temperature",
            "deadline",
            "reply_to",
            "metadata",
            "stop",
            "seed",
            "other",
        ]
    ),
    json_values,
)


@settings(max_examples=100, deadline=None)
@given(body=request_like, msgpack=st.booleans())
def test_request_shaped_objects_decode_or_refuse(body: dict[str, object], msgpack: bool) -> None:
    """Objects near the schema reach the typed decoder's paths, not just the syntax check."""
    data = msgspec.msgpack.encode(body) if msgpack else msgspec.json.encode(body)
    try:
        request = decode_request(data, MSGPACK if msgpack else None)
    except UndecodableRequest as exc:
        assert exc.code in {ErrorCode.SCHEMA_VIOLATION, ErrorCode.MISSING_ID}
        if exc.code is ErrorCode.SCHEMA_VIOLATION and isinstance(body.get("id"), str):
            assert exc.request_id == body["id"]
    else:
        assert request.id == body["id"]


# --- repeated keys --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "key", "request_id", "reply_to"),
    [
        (b'{"id": "a", "prompt": "x", "id": "b"}', "id", "", None),
        (b'{"id": "a", "reply_to": "r1", "prompt": "x", "prompt": "y"}', "prompt", "a", "r1"),
        (b'{"id": "a", "reply_to": "r1", "prompt": "x", "reply_to": "r2"}', "reply_to", "a", None),
        (
            b'{"id": "a", "prompt": "x", "\\u0069d": "b"}',
            "id",
            "",
            None,
        ),  # an escape is no disguise
    ],
    ids=["id", "prompt", "reply_to", "escaped"],
)
def test_a_repeated_json_key_is_invalid_json(
    data: bytes, key: str, request_id: str, reply_to: str | None
) -> None:
    error = refused(data)
    assert error.code is ErrorCode.INVALID_JSON
    assert f"repeats the key {key!r}" in error.message
    assert (error.request_id, error.reply_to) == (request_id, reply_to)  # unless ambiguous


@pytest.mark.parametrize(
    "data",
    [
        b'{"id": "a", "messages": [{"role": "user", "content": "x", "role": "system"}]}',
        b'{"id": "a", "prompt": "x", "metadata": {"role": "a", "role": "b"}}',
        b'{"id": "a", "prompt": "x", "response_format": {"type": "json_schema", "json_schema":'
        b' {"schema": {"type": "object", "properties": {"role": {}}, "type": "array"}}}}',
        b'{"id": "a", "prompt": "x", "future": [{"role": 1, "role": 2}]}',
    ],
    ids=["message", "metadata", "schema", "unknown-field"],
)
def test_a_key_repeated_in_any_json_object_is_refused(data: bytes) -> None:
    error = refused(data)
    assert error.code is ErrorCode.INVALID_JSON
    assert "repeats the key" in error.message
    assert error.request_id == "a"


def test_the_same_key_in_different_objects_is_no_repeat() -> None:
    message = {"role": "user", "content": "x"}
    data = msgspec.json.encode({"id": "a", "messages": [message, message]})
    assert len(decode_request(data).messages or []) == 2


def msgpack_map(entries: list[tuple[str, object]], header: bytes) -> bytes:
    return header + b"".join(
        msgspec.msgpack.encode(k) + msgspec.msgpack.encode(v) for k, v in entries
    )


@pytest.mark.parametrize("size", ["fixmap", "map16", "map32"])
def test_a_repeated_msgpack_key_is_refused(size: str) -> None:
    entries: list[tuple[str, object]] = [("id", "a"), ("prompt", "x"), ("reply_to", "r1")]
    entries += [(f"unknown{i}", i) for i in range(20 if size == "map16" else 0)]
    entries.append(("prompt", "y"))
    count = len(entries)
    header = {
        "fixmap": bytes([0x80 | count]),
        "map16": b"\xde" + count.to_bytes(2, "big"),
        "map32": b"\xdf" + count.to_bytes(4, "big"),
    }[size]
    error = refused(msgpack_map(entries, header), MSGPACK)
    assert error.code is ErrorCode.INVALID_ENCODING
    assert "repeats the key 'prompt'" in error.message
    assert (error.request_id, error.reply_to) == ("a", "r1")


def test_msgpack_without_repeats_passes_the_count() -> None:
    entries: list[tuple[str, object]] = [("id", "a"), ("prompt", "x")]
    entries += [(f"unknown{i}", i) for i in range(20)]
    data = msgpack_map(entries, b"\xdf" + len(entries).to_bytes(4, "big"))
    assert decode_request(data, MSGPACK).id == "a"


def test_the_repeated_key_pass_reads_whatever_msgspec_read() -> None:
    """Numbers the second reader would refuse to build (10,000 digits, 1e99999) are skipped."""
    data = b'{"id": "a", "prompt": "x", "junk": [1e99999, 1' + b"0" * 10_000 + b", -0.0]}"
    assert decode_request(data).id == "a"
