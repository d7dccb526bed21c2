"""The door is total (issue 34): whatever `decode_request` accepts, `door.check` answers with a
deadline or an `InvalidRequest`, and a checked request's schema has a text; no other exception
ever escapes, whatever numbers, schema values, nesting or repeated keys the record holds."""

from __future__ import annotations

import json
import math
import time
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from actors.ingest.rules import check
from messages.codec import JSON, MSGPACK
from messages.error_codes import ErrorCode
from messages.errors import InvalidRequest, UndecodableRequest
from messages.limits import (
    INT64_LIMIT,
    MAX_PRIORITY,
    MAX_SCHEMA_DEPTH,
    MAX_TIMEOUT_MS,
    MIN_PRIORITY,
)
from messages.request_decoding import decode_request

NOW_MS = int(time.time() * 1000)  # the record's timestamp
DEEP = "@@deep@@"  # a schema value replaced, once encoded, by nesting built as bytes
MAX_DIGITS = 4300  # Python's (and so msgspec's) limit on the digits of a decoded integer

# --- what a record may hold -----------------------------------------------------------------

huge_ints = st.builds(
    lambda digits, sign: sign * 10**digits,
    st.integers(18, MAX_DIGITS + 10),
    st.sampled_from([1, -1]),
)
integers = st.one_of(
    st.integers(-3, 300),
    st.integers(-(2**64), 2**64),
    huge_ints,
    st.sampled_from([2**31, 2**63 - 1, 2**63, 2**64 - 1, -(2**63) - 1, 10**400]),
)
floats = st.one_of(
    st.floats(0, 2),
    st.floats(),
    st.sampled_from([5e-324, 1e-45, 1e-40, 1.2e-38, 1e-9, 3.5e38, 1e308, -0.0, math.nan]),
)
huge_texts = st.builds(
    lambda char, count: char * count,
    st.sampled_from(["x", "é", "\x00", "👋", '"']),
    st.integers(0, 300_000),
)
texts = st.one_of(st.text(max_size=12), huge_texts)
offsets = st.integers(-(23 * 60 + 59), 23 * 60 + 59).map(lambda m: timezone(timedelta(minutes=m)))
aware = st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30))
deadlines = st.one_of(
    aware.map(lambda d: d.replace(tzinfo=UTC)),
    st.builds(lambda d, tz: d.replace(tzinfo=tz), aware, offsets),
    st.sampled_from(["9999-12-31T23:59:59-23:59", "0001-01-01T00:00:00+23:59", "2030-01-01"]),
)
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text()),
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=8,
)
# Everything MessagePack carries (JSON only some: those records are MessagePack only).
leaves = st.one_of(
    st.none(),
    st.booleans(),
    integers,
    floats,
    texts,
    st.binary(max_size=8),
    st.builds(msgspec.msgpack.Ext, st.integers(-128, 127), st.binary(max_size=8)),
    aware.map(lambda d: d.replace(tzinfo=UTC)),
    st.just(DEEP),
)
keys = st.one_of(
    st.text(max_size=8), st.integers(-(2**63), 2**63 - 1), st.binary(max_size=4), st.just(())
)
values = st.recursive(
    leaves,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(keys, children, max_size=4)
    ),
    max_leaves=12,
)
schemas = st.one_of(
    st.dictionaries(st.text(max_size=8), json_values, max_size=4),
    st.dictionaries(st.text(max_size=8), values, max_size=4),
)
json_schemas = st.fixed_dictionaries(
    {"schema": schemas}, optional={"name": texts, "strict": st.booleans()}
)
response_formats = st.one_of(
    st.fixed_dictionaries({"type": st.just("json_schema"), "json_schema": json_schemas}),
    st.fixed_dictionaries(
        {"type": st.sampled_from(["text", "json_object", "json_schema", "xml"])},
        optional={"json_schema": json_schemas},
    ),
)
token_ids = st.lists(st.one_of(st.integers(0, 50_000), integers), max_size=6)
PROMPTS: dict[str, st.SearchStrategy[Any]] = {
    "prompt": texts,
    "prompt_token_ids": token_ids,
    "messages": st.lists(st.fixed_dictionaries({"role": texts, "content": texts}), max_size=3),
}
FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "id": st.one_of(st.just("r1"), texts),
    "max_new_tokens": integers,
    "temperature": st.one_of(floats, integers),
    "top_p": st.one_of(floats, integers),
    "top_k": integers,
    "seed": st.one_of(st.none(), integers),
    "stop": st.lists(texts, max_size=18),
    "stop_token_ids": token_ids,
    "model": st.one_of(st.none(), texts),
    "priority": integers,
    "deadline": st.one_of(st.none(), deadlines),
    "timeout_ms": st.one_of(st.none(), integers),
    "reply_to": st.one_of(st.none(), st.just("replies"), texts),
    "metadata": st.dictionaries(texts, texts, max_size=3),
    "stream": st.booleans(),
    "stream_interval_tokens": st.one_of(st.none(), integers),
    "stream_interval_ms": st.one_of(st.none(), floats, integers),
    "response_format": response_formats,
    "presence_penalty": st.one_of(floats, integers),
    "frequency_penalty": st.one_of(floats, integers),
    "repetition_penalty": st.one_of(floats, integers),
    "min_p": st.one_of(floats, integers),
    "min_tokens": integers,
    "logit_bias": st.dictionaries(integers, st.one_of(floats, integers), max_size=3),
    "v": integers,
    "future_field": values,
    **PROMPTS,
}
OPTIONAL = sorted(FIELDS.keys() - PROMPTS.keys() - {"id", "response_format"})


@st.composite
def records(draw: st.DrawFn) -> list[tuple[str, Any]]:
    """A request's entries: an id, a prompt, a few other fields, mostly of the right types (so
    the record reaches the door) but now and then of any value, and maybe a repeated key."""

    def entry(name: str) -> tuple[str, Any]:
        wild = draw(st.integers(0, 9)) == 0  # about one in ten: any value at all
        return name, draw(values if wild else FIELDS[name])

    entries = [entry("id"), entry(draw(st.sampled_from(sorted(PROMPTS))))]
    entries += [entry(name) for name in draw(st.lists(st.sampled_from(OPTIONAL), max_size=4))]
    if draw(st.booleans()):
        entries.append(entry("response_format"))
    repeated = draw(st.one_of(st.none(), st.none(), st.sampled_from([k for k, _ in entries])))
    if repeated is not None:
        entries.insert(0, entry(repeated))
    return entries


nestings = st.tuples(st.integers(1, 1500), st.booleans())


def encoded(
    entries: list[tuple[str, Any]], msgpack: bool, nesting: tuple[int, bool]
) -> bytes | None:
    """The map of `entries` (repeats kept) as MessagePack or JSON, with `DEEP` replaced by
    `nesting` (depth, arrays or objects); None where the encoding cannot hold a value."""
    depth, arrays = nesting
    try:
        if msgpack:
            count = len(entries)
            header = bytes([0x80 | count]) if count < 16 else b"\xde" + count.to_bytes(2, "big")
            body = b"".join(
                msgspec.msgpack.encode(k) + msgspec.msgpack.encode(v) for k, v in entries
            )
            data, deep = header + body, msgspec.msgpack.encode(DEEP)
            nested = b"\x91" * depth + b"\x90" if arrays else b"\x81\xa1a" * depth + b"\x80"
        else:
            parts = (msgspec.json.encode(k) + b":" + msgspec.json.encode(v) for k, v in entries)
            data, deep = b"{" + b",".join(parts) + b"}", msgspec.json.encode(DEEP)
            nested = (
                b"[" * depth + b"]" * depth if arrays else b'{"a":' * depth + b"{}" + b"}" * depth
            )
    except (TypeError, OverflowError, ValueError):  # e.g. an Ext in JSON, 2**64 in MessagePack
        return None
    return data.replace(deep, nested)


def answer(data: bytes, content_type: str) -> None:
    """What the ingest does with a record, up to the door; only typed refusals may escape."""
    try:
        request = decode_request(data, content_type)
    except UndecodableRequest as exc:
        assert isinstance(exc.code, ErrorCode) and exc.message
        return
    try:
        deadline = check(request, NOW_MS)
    except InvalidRequest as exc:
        assert isinstance(exc.code, ErrorCode) and exc.message
        passed = False
    else:
        passed = True
        assert deadline is None or math.isfinite(deadline)
    shape = request.response_format
    if shape is not None:
        try:
            text = shape.schema_text()
        except InvalidRequest as exc:
            assert not passed and exc.code is ErrorCode.INVALID_RESPONSE_FORMAT
        else:
            assert text is None or isinstance(json.loads(text), dict)
    if passed:  # every number the engine gets fits its int64 and float32 fields
        ints = [request.max_new_tokens, request.top_k, request.priority, request.v]
        ints += [request.seed or 0, request.timeout_ms or 0, request.stream_interval_tokens or 0]
        ints += [*(request.prompt_token_ids or []), *request.stop_token_ids]
        ints += [request.min_tokens, *request.logit_bias]
        assert all(-INT64_LIMIT <= i < INT64_LIMIT for i in ints)
        assert MIN_PRIORITY <= request.priority <= MAX_PRIORITY
        reals = [request.temperature, request.top_p, request.min_p, *request.logit_bias.values()]
        reals += [request.presence_penalty, request.frequency_penalty, request.repetition_penalty]
        assert all(math.isfinite(x) for x in reals)


def answer_encoded(
    entries: list[tuple[str, Any]], msgpack: bool, nesting: tuple[int, bool]
) -> None:
    """`answer` the record of `entries`, in the other encoding where one cannot hold them."""
    data = encoded(entries, msgpack, nesting)
    if data is None:
        msgpack = not msgpack
        data = encoded(entries, msgpack, nesting)
    if data is not None:
        answer(data, MSGPACK if msgpack else JSON)


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(entries=records(), nesting=nestings, msgpack=st.booleans())
def test_whatever_decodes_is_checked_or_refused_never_raised(
    entries: list[tuple[str, Any]], nesting: tuple[int, bool], msgpack: bool
) -> None:
    answer_encoded(entries, msgpack, nesting)


NUMBERS = ["max_new_tokens", "temperature", "top_p", "top_k", "seed", "priority", "timeout_ms"]
NUMBERS += ["stream_interval_tokens", "stream_interval_ms", "v", "stop_token_ids"]
NUMBERS += ["presence_penalty", "frequency_penalty", "repetition_penalty", "min_p", "min_tokens"]
NUMBERS += ["logit_bias"]
numbers = st.lists(st.sampled_from(NUMBERS), unique=True, min_size=1, max_size=3).flatmap(
    lambda names: st.fixed_dictionaries({name: FIELDS[name] for name in names})
)


@settings(max_examples=200, deadline=None)
@given(numbers=numbers, msgpack=st.booleans())
def test_whatever_numbers_decode_are_checked_or_refused_never_raised(
    numbers: dict[str, Any], msgpack: bool
) -> None:
    """The same, aimed at numbers: a few fields of any size and sign, the rest plain."""
    answer_encoded([("id", "r1"), ("prompt", "hi"), *numbers.items()], msgpack, (1, True))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=schemas, nesting=nestings, msgpack=st.booleans())
def test_whatever_schema_decodes_is_checked_or_refused_never_raised(
    schema: dict[str, Any], nesting: tuple[int, bool], msgpack: bool
) -> None:
    """The same, aimed at `response_format`: the schema is the request's only odd part."""
    response_format = {"type": "json_schema", "json_schema": {"schema": schema}}
    entries = [("id", "r1"), ("prompt", "hi"), ("response_format", response_format)]
    answer_encoded(entries, msgpack, nesting)


# --- the cases of the issue, one by one -----------------------------------------------------


def door(body: dict[str, Any], content_type: str = JSON) -> float | None:
    body = {"id": "r1", "prompt": "hi", **body}
    encode = msgspec.msgpack.encode if content_type == MSGPACK else msgspec.json.encode
    return check(decode_request(encode(body), content_type), NOW_MS)


def refused(body: dict[str, Any], content_type: str = JSON) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        door(body, content_type)
    return info.value


@pytest.mark.parametrize("content_type", [JSON, MSGPACK])
def test_a_timeout_past_the_maximum_is_refused_not_overflowed(content_type: str) -> None:
    too_long = 10**400 if content_type == JSON else 2**64 - 1  # MessagePack stops at 2**64
    error = refused({"timeout_ms": too_long}, content_type)
    assert error.code is ErrorCode.INVALID_REQUEST
    assert "timeout_ms must be at most" in error.message
    assert len(error.message) < 200  # a huge number is not repeated back whole
    assert door({"timeout_ms": MAX_TIMEOUT_MS}) is not None


def test_a_priority_the_engine_cannot_age_is_refused() -> None:
    assert refused({"priority": 10**400}).code is ErrorCode.INVALID_REQUEST
    assert refused({"priority": MAX_PRIORITY + 1}).code is ErrorCode.INVALID_REQUEST
    assert door({"priority": MIN_PRIORITY}) is None


@pytest.mark.parametrize(
    "value",
    [
        b"\x00bytes",
        msgspec.msgpack.Ext(5, b"x"),
        datetime(2030, 1, 1, tzinfo=UTC),
        math.nan,
        2**64 - 1,
        {"nested": [1, {"deeper": b"x"}]},
        {1: "an integer key"},
    ],
    ids=["bytes", "ext", "timestamp", "nan", "uint64", "nested-bytes", "int-key"],
)
def test_a_msgpack_schema_value_json_cannot_hold_is_refused(value: object) -> None:
    response_format = {"type": "json_schema", "json_schema": {"schema": {"const": value}}}
    error = refused({"response_format": response_format}, MSGPACK)
    assert error.code is ErrorCode.INVALID_RESPONSE_FORMAT
    assert "$.const" in error.message


def deep_schema(depth: int, content_type: str) -> bytes:
    """A request whose schema holds arrays nested `depth` deep."""
    response_format = {"type": "json_schema", "json_schema": {"schema": {"d": DEEP}}}
    entries = [("id", "r1"), ("prompt", "hi"), ("response_format", response_format)]
    data = encoded(entries, content_type == MSGPACK, (depth, True))
    assert data is not None
    return data


@pytest.mark.parametrize("content_type", [JSON, MSGPACK])
@pytest.mark.parametrize("depth", [MAX_SCHEMA_DEPTH, 500])
def test_a_deeply_nested_schema_is_refused_not_raised(content_type: str, depth: int) -> None:
    with pytest.raises(InvalidRequest) as info:
        check(decode_request(deep_schema(depth, content_type), content_type), NOW_MS)
    assert info.value.code is ErrorCode.INVALID_RESPONSE_FORMAT
    assert f"deeper than {MAX_SCHEMA_DEPTH}" in info.value.message


@pytest.mark.parametrize("content_type", [JSON, MSGPACK])
def test_a_schema_too_deep_to_decode_is_undecodable(content_type: str) -> None:
    with pytest.raises(UndecodableRequest) as info:
        decode_request(deep_schema(5000, content_type), content_type)
    assert info.value.code in {ErrorCode.INVALID_JSON, ErrorCode.INVALID_ENCODING}


@pytest.mark.parametrize("content_type", [JSON, MSGPACK])
def test_the_deepest_schema_a_decoder_reads_is_refused_not_raised(content_type: str) -> None:
    """Just under the decoders' recursion limit: a recursive walk of the decoded schema (as
    `json.dumps` made its text) has no stack left there."""
    low, high = 1, 5000  # readable, not readable
    while high - low > 1:
        mid = (low + high) // 2
        try:
            decode_request(deep_schema(mid, content_type), content_type)
        except UndecodableRequest:
            high = mid
        else:
            low = mid
    request = decode_request(deep_schema(low, content_type), content_type)
    assert request.response_format is not None
    with pytest.raises(InvalidRequest) as info:
        check(request, NOW_MS)
    assert info.value.code is ErrorCode.INVALID_RESPONSE_FORMAT
    with pytest.raises(InvalidRequest):
        request.response_format.schema_text()


@pytest.mark.parametrize(
    ("content_type", "latest", "earliest"),
    [
        (JSON, "9999-12-31T23:59:59-23:59", "0001-01-01T00:00:00+23:59"),
        # MessagePack timestamps are UTC: a zone cannot push them past year 9999 or before 1.
        (MSGPACK, datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC), datetime(1, 1, 1, tzinfo=UTC)),
    ],
)
def test_far_deadlines_neither_raise_nor_overflow(
    content_type: str, latest: object, earliest: object
) -> None:
    deadline = door({"deadline": latest}, content_type)
    assert deadline is not None and deadline > time.monotonic() + 1e11
    assert refused({"deadline": earliest}, content_type).code is ErrorCode.DEADLINE_EXCEEDED


def test_a_msgpack_timestamp_past_year_9999_is_undecodable() -> None:
    seconds = msgspec.msgpack.Ext(-1, (0).to_bytes(4, "big") + (2**62).to_bytes(8, "big"))
    data = msgspec.msgpack.encode({"id": "r1", "prompt": "hi", "deadline": seconds})
    with pytest.raises(UndecodableRequest) as info:
        decode_request(data, MSGPACK)
    assert info.value.code is ErrorCode.INVALID_ENCODING  # no decoder reads it, even loosely
    assert "Timestamp is out of range" in info.value.message


def test_huge_token_ids_are_refused_before_the_model() -> None:
    error = refused({"prompt": None, "prompt_token_ids": [1, 10**400]})
    assert error.code is ErrorCode.TOKEN_OUT_OF_VOCABULARY
    assert refused({"stop_token_ids": [2**31]}).code is ErrorCode.TOKEN_OUT_OF_VOCABULARY


def test_degenerate_sampling_values_are_refused() -> None:
    assert refused({"top_p": 1e-40}, MSGPACK).code is ErrorCode.INVALID_SAMPLING_PARAMS
    assert refused({"temperature": 1e7}).code is ErrorCode.INVALID_SAMPLING_PARAMS
    assert door({"temperature": 1e-45}) is None  # greedy on the device
