"""gpu.memory.byte_sizes: reading sizes such as 80GiB or 1.5GB, and printing byte counts."""

from __future__ import annotations

import pytest

from gpu.memory.byte_sizes import format_bytes, parse_size

GiB = 2**30
MiB = 2**20


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("80GiB", 80 * GiB),
        ("512MiB", 512 * MiB),
        ("1.5GB", 1_500_000_000),
        ("1073741824", 1_073_741_824),
        ("4KiB", 4096),
        ("4kb", 4000),
        ("2TiB", 2 * 2**40),
        ("1TB", 10**12),
        ("16Gi", 16 * GiB),
        ("100B", 100),
        (" 80 GiB ", 80 * GiB),
        ("0.5GiB", GiB // 2),
        ("1.1GiB", 1_181_116_006),  # floored to whole bytes
    ],
)
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "cannot read"),
        ("abc", "cannot read"),
        ("-1GiB", "cannot read"),
        ("1e9", "cannot read"),
        ("inf", "cannot read"),
        ("80G", "ambiguous unit 'G'.*GiB.*GB"),
        ("5XB", "unknown unit 'XB'"),
        ("1.2.3GB", "cannot read"),
    ],
)
def test_parse_size_rejects_bad_text(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_size(text)


def test_format_bytes() -> None:
    assert format_bytes(512) == "512 B"
    assert format_bytes(3 * GiB // 2) == "1.50 GiB"
    assert format_bytes(-2 * MiB) == "-2.00 MiB"
    assert format_bytes(3 * 2**40) == "3.00 TiB"
