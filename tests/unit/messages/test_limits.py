"""The result-size bound holds for the worst results a request within the limits can make."""

from __future__ import annotations

import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from messages.codec import JSON, MSGPACK, Codec
from messages.error_codes import ErrorCode
from messages.limits import (
    MAX_ERROR_MESSAGE_CHARS,
    MAX_ID_BYTES,
    MAX_METADATA_CHARS,
    MAX_NAME_CHARS,
    cut,
    number_text,
    result_size_bound,
)
from messages.result import ErrorInfo, GenerateResult, ModelRef, SourceRef, Usage

codec = Codec(GenerateResult)
# Control characters are JSON's worst case (6 bytes each); a 4-byte character the worst UTF-8.
WORST = "\x01"
WIDE = "\U0001f600"


def worst_result(max_new_tokens: int, token_bytes: int, char: str) -> GenerateResult:
    per_token = char * (token_bytes // len(char.encode()) or 1)
    half = MAX_METADATA_CHARS // 2 // 64
    return GenerateResult(
        id=WORST * MAX_ID_BYTES,
        text=per_token * max_new_tokens,
        token_ids=[2**31 - 1] * max_new_tokens,
        usage=Usage(prompt_tokens=2**31, completion_tokens=2**31, total_tokens=2**32),
        model=ModelRef(name=WORST * MAX_NAME_CHARS, digest=WORST * MAX_NAME_CHARS),
        worker=WORST * MAX_NAME_CHARS,
        error=ErrorInfo(code=ErrorCode.ENGINE_ERROR, message=WORST * MAX_ERROR_MESSAGE_CHARS),
        source=SourceRef(topic=WORST * 249, partition=2**31, offset=2**63 - 1),
        metadata={f"{i:02d}" + WORST * (half - 2): WORST * half for i in range(64)},
    )


@settings(max_examples=30, deadline=None)
@given(
    max_new_tokens=st.integers(1, 300),
    token_bytes=st.integers(1, 40),
    char=st.sampled_from([WORST, WIDE, "a", '"']),
)
def test_no_result_within_the_limits_is_larger_than_the_bound(
    max_new_tokens: int, token_bytes: int, char: str
) -> None:
    result = worst_result(max_new_tokens, token_bytes, char)
    bound = result_size_bound(max_new_tokens=max_new_tokens, max_token_bytes=token_bytes)
    for content_type in (JSON, MSGPACK):
        assert len(codec.encode(result, content_type)) <= bound


def test_the_bound_grows_with_the_tokens_a_request_may_ask_for() -> None:
    small = result_size_bound(max_new_tokens=16, max_token_bytes=16)
    assert result_size_bound(max_new_tokens=4096, max_token_bytes=16) > small


@given(st.text(string.printable, max_size=50), st.integers(1, 20))
def test_cut_keeps_short_text_and_cuts_long_text_to_the_limit(text: str, limit: int) -> None:
    out = cut(text, limit)
    assert len(out) <= max(limit, len(text) if len(text) <= limit else 0)
    assert out == text if len(text) <= limit else out.endswith("…") and len(out) == limit


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0, "0"),
        (-(2**63), "-9223372036854775808"),
        (1e-45, "1e-45"),
        (10**400, "100000000000… (401 digits)"),
        (-(10**4299), "-10000000000… (4300 digits)"),
    ],
)
def test_a_number_in_a_message_is_short_however_long_it_is(value: float, text: str) -> None:
    assert number_text(value) == text
