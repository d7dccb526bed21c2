"""`actors.kafka.record_reader`: fetched batches that aiokafka's parser cannot read become
records the consumer can answer, never an exception out of `getmany()`.

Batches are built with aiokafka's own builder and then given what a non-Python producer (or a
damaged log) can put there: a header key that is not UTF-8, a CRC that does not match, a
record cut short, a compressed body that does not decompress. They are read through aiokafka's
real `PartitionRecords`, the fetcher's loop over a fetch response.
"""

from __future__ import annotations

import gzip
import struct

import pytest
from aiokafka.consumer.fetcher import READ_UNCOMMITTED, PartitionRecords
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.record.util import calc_crc32c
from aiokafka.structs import TopicPartition

from actors.kafka.record_reader import (
    UNREADABLE_HEADER,
    LenientRecords,
    readable_headers,
    unreadable,
)

TP = TopicPartition("requests", 0)
BAD_KEY = b"\xff\xfekey"  # what `kcat -H $'\xff\xfekey=v'` writes


def _batch(base: int, n: int, bad: frozenset[int] = frozenset(), gzip_body: bool = False) -> bytes:
    """A v2 batch of `n` records at offsets base.., the records in `bad` with a header key
    that is not UTF-8; the CRC made right afterwards, as a real producer's would be."""
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=0, producer_id=-1, producer_epoch=-1,
        base_sequence=-1, batch_size=1 << 20,
    )  # fmt: skip
    for i in range(n):
        key = "\x01" * len(BAD_KEY) if i in bad else "content-type"
        builder.append(i, timestamp=1000 + i, key=b"k%d" % i, value=b"v%d" % i,
                       headers=[(key, b"application/json")])  # fmt: skip
    buf = bytearray(builder.build())
    buf = buf.replace(b"\x01" * len(BAD_KEY), BAD_KEY)
    if gzip_body:
        body = gzip.compress(bytes(buf[61:]))
        buf = buf[:61] + body
        struct.pack_into(">i", buf, 8, len(buf) - 12)
        struct.pack_into(">h", buf, 21, struct.unpack_from(">h", buf, 21)[0] | 1)
    struct.pack_into(">q", buf, 0, base)
    return _recrc(buf)


def _recrc(buf: bytearray) -> bytes:
    struct.pack_into(">I", buf, 17, calc_crc32c(bytes(buf[21:])))
    return bytes(buf)


def _consume(data: bytes, fetch_offset: int = 0) -> list:
    """What aiokafka's fetcher hands the application from one fetch response."""
    records = PartitionRecords(
        TP, LenientRecords(data), None, fetch_offset, None, None, True, READ_UNCOMMITTED
    )
    return list(records)


def test_aiokafka_alone_raises_on_a_header_key_that_is_not_utf8() -> None:
    records = MemoryRecords(_batch(0, 3, bad=frozenset({1})))
    with pytest.raises(UnicodeDecodeError):
        list(records.next_batch())


def test_good_batches_read_as_aiokafka_reads_them() -> None:
    data = _batch(0, 4) + _batch(4, 2)
    got = _consume(data)
    assert [r.offset for r in got] == [0, 1, 2, 3, 4, 5]
    assert [r.value for r in got] == [b"v0", b"v1", b"v2", b"v3", b"v0", b"v1"]
    assert all(unreadable(r) is None for r in got)
    assert got[0].headers == (("content-type", b"application/json"),)


@pytest.mark.parametrize("gzip_body", [False, True])
def test_a_header_key_not_utf8_marks_that_record_only(gzip_body: bool) -> None:
    data = _batch(10, 5, bad=frozenset({2}), gzip_body=gzip_body) + _batch(15, 2)
    got = _consume(data, fetch_offset=10)
    assert [r.offset for r in got] == [10, 11, 12, 13, 14, 15, 16]
    marked = [r for r in got if unreadable(r) is not None]
    assert [r.offset for r in marked] == [12]
    bad = marked[0]
    assert "not UTF-8" in (unreadable(bad) or "")
    assert bad.value == b"v2" and bad.key == b"k2" and bad.timestamp == 1002
    escaped = [k for k, _ in bad.headers if k != UNREADABLE_HEADER]
    assert [k.encode("utf-8", "surrogateescape") for k in escaped] == [BAD_KEY]
    assert readable_headers(bad.headers) == []  # neither the marker nor the raw key
    assert [r.value for r in got if r is not bad] == [b"v0", b"v1", b"v3", b"v4", b"v0", b"v1"]


def test_a_fetch_that_starts_inside_the_batch_skips_what_it_read_before() -> None:
    got = _consume(_batch(0, 5, bad=frozenset({1})), fetch_offset=3)
    assert [r.offset for r in got] == [3, 4]
    assert all(unreadable(r) is None for r in got)


def test_a_crc_mismatch_is_one_unreadable_record_at_the_batch_end() -> None:
    buf = bytearray(_batch(20, 4))
    buf[-1] ^= 0xFF  # the last byte of the last record's header value
    got = _consume(bytes(buf) + _batch(24, 1), fetch_offset=20)
    assert [r.offset for r in got] == [23, 24]
    reason = unreadable(got[0]) or ""
    assert "CRC" in reason and "20..23" in reason
    assert got[0].value == bytes(buf)
    assert unreadable(got[1]) is None


def test_a_record_cut_short_ends_the_batch_with_an_unreadable_record() -> None:
    buf = bytearray(_batch(0, 3, bad=frozenset({0})))
    del buf[-3:]  # the last record's header value, cut short
    struct.pack_into(">i", buf, 8, len(buf) - 12)
    got = _consume(_recrc(buf))
    assert [r.offset for r in got] == [0, 1, 2]
    assert unreadable(got[0]) is not None  # the bad header key
    assert unreadable(got[1]) is None
    assert "malformed" in (unreadable(got[2]) or "")


def test_a_batch_claiming_more_records_than_it_has_hands_out_those_it_has() -> None:
    buf = bytearray(_batch(0, 3, bad=frozenset({0})))
    struct.pack_into(">i", buf, 57, 4)  # the record count: one more than there is
    got = _consume(_recrc(buf))
    assert [r.offset for r in got] == [0, 1, 2]  # nothing past the batch's last offset
    assert [unreadable(r) is not None for r in got] == [True, False, False]


def test_a_body_that_does_not_decompress_is_unreadable() -> None:
    buf = bytearray(_batch(0, 2, gzip_body=True))
    buf[70:80] = b"\x00" * 10  # inside the gzip stream
    got = _consume(_recrc(buf))
    assert len(got) == 1 and got[0].offset == 1
    assert unreadable(got[0]) is not None
