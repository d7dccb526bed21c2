"""Fetched records read so that no byte in a partition can crash a consumer.

aiokafka parses a fetched record batch only when `getmany()` hands its records out, and a
record it cannot parse raises there, inside `getmany()`: a header key that is not UTF-8
(librdkafka, Java and Go clients write header keys as raw bytes, and brokers store them), a
batch whose CRC does not match, one that does not decompress, a truncated record. The
application never sees the record, and a consumer restarted at the last commit fetches the
same batch and fails the same way, for ever.

`install()` puts `LenientRecords` in the place of the record set aiokafka's fetcher builds
from each fetch response. Batches are parsed by aiokafka's own parser (its C extension) as
before; when that parser fails in a batch, the rest of the batch is read again here, from the
record it failed on, by a parser that never raises:

- a record whose header keys are not all UTF-8 is handed out whole, such keys decoded with
  `surrogateescape` (their bytes are `key.encode("utf-8", "surrogateescape")`);
- what cannot be read at all (a CRC mismatch, a codec failure, a truncated or malformed
  record) is handed out as one record at the batch's last offset, its value the batch's raw
  bytes from the first unread record on. The offsets it covers are named in the reason; the
  consumer's position moves past the batch, as aiokafka's does after any batch.

Either carries a marker header (`UNREADABLE_HEADER`, the reason as UTF-8), whose key no
record from the wire can have: `unreadable(record)` returns the reason, or None for a record
read as sent. Every consumer of tokenmill's checks it and answers or skips such a record.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import aiokafka.consumer.fetcher as _fetcher
from aiokafka import codec
from aiokafka.record.default_records import DefaultRecordBatch
from aiokafka.record.legacy_records import LegacyRecordBatch
from aiokafka.record.util import decode_varint

# A lone high surrogate: strict UTF-8 decoding never yields one, and `surrogateescape`
# yields only U+DC80..U+DCFF, so no header read from the wire has this key.
UNREADABLE_HEADER = "\ud800tokenmill-unreadable"

_LOG_OVERHEAD = 12  # base offset (int64) + batch length (int32)
_MAGIC_AT = 16
_V2_HEADER = struct.Struct(">qiibIhiqqqhii")  # the 61-byte header of a v2 batch
_V2_RECORDS_AT = _V2_HEADER.size
_CODECS = {
    1: codec.gzip_decode,
    2: codec.snappy_decode,
    3: codec.lz4_decode,
    4: codec.zstd_decode,
}


def unreadable(record: Any) -> str | None:
    """Why `record` (a `ConsumerRecord`) could not be read as sent; None when it was."""
    for key, value in record.headers or ():
        if key == UNREADABLE_HEADER:
            return bytes(value or b"").decode("utf-8", "replace")
    return None


def readable_headers(headers: Any) -> list[tuple[str, bytes]]:
    """`headers` without the marker and without keys that are not UTF-8 (no producer can
    write those again), and without null values."""
    out = []
    for key, value in headers or ():
        if value is None or key == UNREADABLE_HEADER or not _is_utf8(key):
            continue
        out.append((key, value))
    return out


def _is_utf8(key: str) -> bool:
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def install() -> None:
    """Make aiokafka's fetcher read every fetch through `LenientRecords` (process-wide: every
    consumer of this process). Idempotent."""
    _fetcher.MemoryRecords = LenientRecords


@dataclass(frozen=True)
class UnreadableRecord:
    """A record as aiokafka's fetcher consumes one (the fields `PartitionRecords` reads)."""

    offset: int
    timestamp: int
    timestamp_type: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]
    checksum: None = None


class LenientRecords:
    """The batches of one fetch response (aiokafka's `MemoryRecordsProtocol`)."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._pos = 0

    def size_in_bytes(self) -> int:
        return len(self._data)

    def has_next(self) -> bool:
        return self._next_end() is not None

    def _next_end(self) -> int | None:
        """Where the next whole batch ends; None when no whole batch is left (a fetch may end
        with a partial one, which the next fetch brings whole). A batch too short to have a
        header is still a batch: it is read as unreadable."""
        if len(self._data) - self._pos < _LOG_OVERHEAD:
            return None
        (length,) = struct.unpack_from(">i", self._data, self._pos + 8)
        end = self._pos + _LOG_OVERHEAD + length
        return end if length >= 0 and end <= len(self._data) else None

    def next_batch(self) -> LenientBatch | None:
        end = self._next_end()
        if end is None:
            return None
        raw = memoryview(self._data)[self._pos : end]
        self._pos = end
        return LenientBatch(raw)


class LenientBatch:
    """One batch: aiokafka's parser first, this module's from the record it failed on."""

    def __init__(self, raw: memoryview) -> None:
        self._raw = raw
        self.base_offset: int
        (self.base_offset,) = struct.unpack_from(">q", raw, 0)
        magic = raw[_MAGIC_AT] if len(raw) > _MAGIC_AT else -1
        self._inner: Any = None
        try:
            if magic == 2:
                self._inner = DefaultRecordBatch(raw)
            elif magic in (0, 1):
                self._inner = LegacyRecordBatch(raw, magic)
        except Exception:
            self._inner = None
        self._records = self._read()

    # -- what the fetcher asks of a batch --------------------------------------------------

    def validate_crc(self) -> bool:
        return True  # checked as the records are read: a mismatch is an unreadable record

    @property
    def producer_id(self) -> int | None:
        return self._inner.producer_id if self._inner is not None else None

    @property
    def is_control_batch(self) -> bool:
        return bool(self._inner is not None and self._inner.is_control_batch)

    @property
    def is_transactional(self) -> bool:
        return bool(self._inner is not None and self._inner.is_transactional)

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1

    @property
    def last_offset(self) -> int:
        if self._inner is not None and self._raw[_MAGIC_AT] == 2:
            return self.base_offset + int(self._inner.last_offset_delta)
        if self._inner is not None:
            return int(self._inner.next_offset) - 1
        return self.base_offset  # a header that does not parse: its first offset is all

    def __iter__(self) -> LenientBatch:
        return self

    def __next__(self) -> Any:
        return next(self._records)

    # -- reading -----------------------------------------------------------------------------

    def _read(self) -> Iterator[Any]:
        last: int | None = None  # the last offset handed out
        inner = self._inner
        if inner is None:
            yield self._unreadable(None, "the batch's header cannot be read")
            return
        try:
            if not inner.validate_crc():
                yield self._unreadable(None, "the batch's CRC does not match its bytes")
                return
            for record in inner:
                last = record.offset
                yield record
            return
        except Exception as exc:
            failure = f"{type(exc).__name__}: {exc}"
        if self._raw[_MAGIC_AT] != 2:
            yield self._unreadable(last, f"the record cannot be read ({failure})")
            return
        yield from self._read_leniently(last, failure)

    def _read_leniently(self, last: int | None, failure: str) -> Iterator[Any]:
        """The records after `last` of a v2 batch, never raising (see the module's doc)."""
        try:
            header = _V2_HEADER.unpack_from(self._raw, 0)
            attributes, base_ts, max_ts, count = header[5], header[7], header[8], header[12]
            body: bytes | memoryview = self._raw[_V2_RECORDS_AT:]
            if attributes & 0x07:
                body = _CODECS[attributes & 0x07](bytes(body))
        except Exception as exc:
            yield self._unreadable(last, f"the batch cannot be decompressed ({exc!r})")
            return
        log_append_time = bool(attributes & 0x08)
        pos = 0
        for _ in range(count):
            try:
                record, pos = _parse_record(body, pos, self.base_offset, base_ts)
            except Exception as exc:
                if last is None or last < self.last_offset:  # else: the batch is all read
                    yield self._unreadable(last, f"a record is malformed ({exc!r}; {failure})")
                return
            if log_append_time:
                record = UnreadableRecord(
                    record.offset, max_ts, 1, record.key, record.value, record.headers
                )
            if last is not None and record.offset <= last:
                continue
            last = record.offset
            yield record

    def _unreadable(self, last: int | None, reason: str) -> UnreadableRecord:
        """One record for what is left of the batch: its last offset, its raw bytes."""
        first = self.base_offset if last is None else last + 1
        at = max(self.last_offset, first)
        text = f"{reason}; offsets {first}..{at} of the batch"
        return UnreadableRecord(
            offset=at,
            timestamp=-1,
            timestamp_type=0,
            key=None,
            value=bytes(self._raw),
            headers=[(UNREADABLE_HEADER, text.encode())],
        )


def _parse_record(
    body: bytes | memoryview, pos: int, base_offset: int, base_ts: int
) -> tuple[UnreadableRecord, int]:
    """One v2 record at `pos` (varints are zigzag-encoded); header keys that are not UTF-8
    are kept escaped and named in a marker header."""
    length, pos = decode_varint(body, pos)
    end = pos + length
    if length < 0 or end > len(body):
        raise ValueError(f"a record at byte {pos} overruns its batch")
    pos += 1  # attributes: unused
    ts_delta, pos = decode_varint(body, pos)
    offset_delta, pos = decode_varint(body, pos)
    key, pos = _bytes_field(body, pos, end)
    value, pos = _bytes_field(body, pos, end)
    count, pos = decode_varint(body, pos)
    headers: list[tuple[str, bytes | None]] = []
    bad_keys = []
    for i in range(count):
        raw_key, pos = _bytes_field(body, pos, end)
        header_value, pos = _bytes_field(body, pos, end)
        try:
            name = (raw_key or b"").decode("utf-8")
        except UnicodeDecodeError:
            name = (raw_key or b"").decode("utf-8", "surrogateescape")
            bad_keys.append(i)
        headers.append((name, header_value))
    if pos != end:
        raise ValueError(f"a record's fields end at byte {pos}, its length says {end}")
    if bad_keys:
        reason = f"header key {', '.join(map(str, bad_keys))} is not UTF-8 text"
        headers.append((UNREADABLE_HEADER, reason.encode()))
    record = UnreadableRecord(base_offset + offset_delta, base_ts + ts_delta, 0, key, value,
                              headers)  # fmt: skip
    return record, end


def _bytes_field(body: bytes | memoryview, pos: int, end: int) -> tuple[bytes | None, int]:
    size, pos = decode_varint(body, pos)
    if size < 0:
        return None, pos
    if pos + size > end:
        raise ValueError(f"a field of {size} bytes overruns its record")
    return bytes(body[pos : pos + size]), pos + size
